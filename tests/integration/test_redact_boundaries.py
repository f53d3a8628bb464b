"""A key quoted back in a 200 reply, a batch result, a plugin's trace or a Ray result lands in no file (issue 38).

The simulator's `quote_key` knob makes every reply quote the server's key inside the text the evaluator parses
(stub names and reasons, plan steps, selected names), online and in the batch APIs' results alike; a plugin
architecture puts the key's value in its trace; a Ray output row carries it in its reply. Every byte the
commands wrote (output folders, the response cache's SQLite files, request and result files) and everything they
printed is searched for the key: before the fix it was in report.md, view.html, queries.jsonl and cache.db.
"""

from __future__ import annotations

from pathlib import Path

import orjson
from helpers import REPO
from helpers.procs import simulator

from evaluator.batch.ray_engine import row_result
from evaluator.batch.request_format import read_results, write_lines
from evaluator.cli import main as cli
from evaluator.llm import LLMEngine, load_profile

MCP = REPO / "examples" / "mcp"
ENV = "EVALUATOR_TEST_QUOTED_KEY"
KEY = "sk-canary-quoted-7d2e-4f0b-9a1c-reply-key"
PLUGIN = f'''
import os
from evaluator.study.archs import Context, Discovery

class Leaky:
    name = "leaky"

    async def retrieve(self, ctx: Context) -> Discovery:
        hits = ctx.query_hits
        return Discovery(hits.ids, hits.scores, trace={{"said": "my key is " + os.environ["{ENV}"]}})
'''


def _leaks(root: Path, printed: list[str]) -> list[str]:
    found = [str(f.relative_to(root)) for f in sorted(root.rglob("*")) if f.is_file() and KEY.encode() in f.read_bytes()]
    return found + [f"output {i}" for i, text in enumerate(printed) if KEY in text]


def test_a_quoted_key_reaches_no_file(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(ENV, KEY)
    monkeypatch.delenv("EVALUATOR_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "leaky.py").write_text(PLUGIN, encoding="utf-8")
    printed: list[str] = []
    with simulator(api_key=KEY, quote_key=True) as sim:
        prof = tmp_path / "quoting.toml"
        prof.write_text(f'model = "sim-1"\n[connection]\nbase_url = "{sim.base_url}"\napi_key_env = "{ENV}"\n'
                        '[server]\nsimulated = true\n[batch]\napi = "openai"\n[pacing]\nconcurrency = 8\n'
                        '[retries]\nmax_retries = 1\nbackoff_base_s = 0.01\n', encoding="utf-8")
        base = ["--tools", str(MCP / "tools"), "--queries", str(MCP / "queries.jsonl"), "--limit", "2", "--runs", "1",
                "--model", str(prof), "--no-progress", "--no-extras"]
        # An online study with a plugin whose trace holds the key.
        rc = cli.main([*base, "--archs", f"rtp,ptr,{tmp_path / 'leaky.py'}:Leaky", "--cache-dir", str(tmp_path / "c1"),
                       "--out", str(tmp_path / "online")])
        printed += capfd.readouterr()
        assert rc == 0, printed[-1]
        records = (tmp_path / "online" / "queries.jsonl").read_text()
        assert f"[REDACTED:{ENV}]" in records  # the replies did quote it, in text the records keep
        assert "my key is [REDACTED" in records  # the plugin's trace
        # A --batch study: the batch results quote it too.
        rc = cli.main([*base, "--batch", "--cache-dir", str(tmp_path / "c2"), "--out", str(tmp_path / "batch")])
        printed += capfd.readouterr()
        assert rc == 0, printed[-1]
        assert f"[REDACTED:{ENV}]" in (tmp_path / "batch" / "queries.jsonl").read_text()
        # `requests run` keeps each raw reply in its results file; `requests import` caches them.
        rc = cli.main(["requests", "export", str(tmp_path / "req.jsonl"), *base, "--cache-dir", str(tmp_path / "c3")])
        assert rc == 0
        rc = cli.main(["requests", "run", str(tmp_path / "req.jsonl"), "--model", str(prof), "--out",
                       str(tmp_path / "res.jsonl"), "--cache-dir", str(tmp_path / "c4"), "--no-progress"])
        assert rc == 0
        rc = cli.main(["requests", "import", str(tmp_path / "res.jsonl"), "--model", str(prof),
                       "--cache-dir", str(tmp_path / "c3")])
        printed += capfd.readouterr()
        assert rc == 0, printed[-1]
        # A Ray output row (what `requests run --engine ray` reads back from Ray Data LLM), stored and written.
        profile = load_profile(str(prof))
        engine = LLMEngine(profile, cache_root=tmp_path / "c5", api_key="")
        reply = {"id": "x", "object": "chat.completion", "model": "sim-1", "usage": {"prompt_tokens": 3, "completion_tokens": 4},
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": f"quoted {KEY}"},
                              "finish_reason": "stop"}]}
        row = {"custom_id": "r1", "key": "k-ray-1", "error": "", "message": "", "status": 200,
               "text": orjson.dumps(reply).decode()}
        res = row_result(row, engine)
        assert engine.lookup("k-ray-1") is not None and KEY not in (engine.lookup("k-ray-1").content or "")
        engine.close_cache()
        write_lines(tmp_path / "ray-results.jsonl", [res])
        assert read_results(tmp_path / "ray-results.jsonl")[0].ok
    assert _leaks(tmp_path, printed) == []
