"""A TLS endpoint whose certificate is not trusted is named plainly (issue 38): "certificate not trusted: self-signed
certificate", first in the line, and the run stops at once (sending again cannot help).

Before the fix a self-signed HTTPS endpoint said "the endpoint does not answer" after every retry and named the
certificate error only in brackets.
"""

from __future__ import annotations

import asyncio
import ssl

import pytest
from aiohttp import web
from helpers.procs import run

from evaluator.core.errors import FatalLLMError
from evaluator.llm import LLMEngine, load_profile


@pytest.fixture
def self_signed(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    done = run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"], timeout=300)
    assert done.returncode == 0, done.stderr
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


def test_an_untrusted_certificate_stops_the_run_in_plain_words(self_signed, tmp_path):
    hits = []

    async def chat(request: web.Request) -> web.Response:
        hits.append(1)
        return web.json_response({"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]})

    async def go() -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=self_signed)
        await site.start()
        port = runner.addresses[0][1]
        profile = load_profile("local", base_url=f"https://127.0.0.1:{port}/v1", env={}, max_retries=3,
                               backoff_base_s=0.01, adaptive_concurrency=False)
        try:
            async with LLMEngine(profile, cache_root=tmp_path / "cache", api_key="") as llm:
                with pytest.raises(FatalLLMError) as e:
                    await llm.chat([{"role": "user", "content": "hi"}], run=0, prompt_version="v")
            return e.value.line()
        finally:
            await runner.cleanup()

    line = asyncio.run(go())
    assert line.startswith("error: local: certificate not trusted: self-signed certificate (https://127.0.0.1:"), line
    assert "SSL_CERT_FILE" in line and "does not answer" not in line and "\n" not in line
    assert hits == []  # no request reached the server
