"""`python -m evaluator requests run|import` on request files, as a user runs them (simulator on loopback)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from helpers.cli import run_cli, start_cli
from helpers.procs import simulator, wait_until
from helpers.request_files import cached_count, write_requests

from evaluator.llm import LLMEngine, load_profile


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_cli("requests", *args, cwd=cwd)


def test_requests_run_resumes_after_sigkill_without_resending(tmp_path):
    lines = write_requests(tmp_path / "in.jsonl", 1000)
    # 0.05 s a reply, 16 at a time: 700 replies still take ~2 s when the kill comes, however late the test sees it
    with simulator(latency_s=0.05) as sim:
        args = ["run", str(tmp_path / "in.jsonl"), "--model", "sim", "--base-url", sim.base_url, "--concurrency", "16",
                "--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path / "out.jsonl"), "--no-progress"]
        child = start_cli("requests", *args, cwd=tmp_path, stdout=subprocess.DEVNULL)
        wait_until(lambda: sim.stats()["ok"] >= 300, child, what="300 replies")
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        assert not (tmp_path / "out.jsonl").exists()
        profile = load_profile("sim", base_url=sim.base_url)
        done = cached_count(profile, tmp_path / "c", lines)
        assert 300 - 16 <= done < 1000  # up to --concurrency replies were still on the wire at the kill
        sim.reset_stats()
        again = run(*args, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert sim.stats()["ok"] == 1000 - done  # finished requests came from the cache, not the server
    results = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["custom_id"] for r in results] == [x["custom_id"] for x in lines]
    assert all(r["response"]["status_code"] == 200 and r["response"]["body"]["choices"][0]["message"]["content"]
               for r in results)


def test_results_import_then_run_answers_from_cache(tmp_path):
    """A results file from elsewhere (a batch, vllm run-batch) imported with --model feeds `requests run`."""
    lines = write_requests(tmp_path / "in.jsonl", 20)
    with simulator() as sim:
        first = run("run", str(tmp_path / "in.jsonl"), "--model", "sim", "--base-url", sim.base_url,
                    "--cache-dir", str(tmp_path / "c1"), "--out", str(tmp_path / "r.jsonl"), "--no-progress", cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        results = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
        # Key the results by their request bodies' cache keys, as `requests export` does, and break one.
        profile = load_profile("sim", base_url=sim.base_url)
        engine = LLMEngine(profile, cache_root=tmp_path / "keys")
        keyed = [dict(r, custom_id=engine.prepare_body(x["body"]).key) for r, x in zip(results, lines, strict=True)]
        engine.close_cache()
        keyed[3] = dict(keyed[3], response={"status_code": 500, "body": {"error": {"message": "server had an error"}}})
        (tmp_path / "keyed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in keyed), encoding="utf-8")
        imp = run("import", str(tmp_path / "keyed.jsonl"), "--model", "sim", "--cache-dir", str(tmp_path / "c2"), cwd=tmp_path)
        assert imp.returncode == 0, imp.stderr
        assert "Imported 19 replies" in imp.stdout and "1 errors" in imp.stdout
        sim.reset_stats()
        second = run("run", str(tmp_path / "in.jsonl"), "--model", "sim", "--base-url", sim.base_url,
                     "--cache-dir", str(tmp_path / "c2"), "--out", str(tmp_path / "r2.jsonl"), "--no-progress", cwd=tmp_path)
        assert second.returncode == 0, second.stderr
        assert sim.stats()["ok"] == 1  # only the request whose result was an error was sent
    again = [json.loads(x) for x in (tmp_path / "r2.jsonl").read_text().splitlines()]
    content = lambda r: r["response"]["body"]["choices"][0]["message"]["content"]  # noqa: E731
    assert [content(r) for r in again] == [content(r) for r in results]


@pytest.mark.parametrize("bad, needle", [
    ('{"custom_id": "a", "body": {"messages": []}}\nnot json\n', "in.jsonl:2"),
    ('{"custom_id": "a", "body": {"messages": []}}\n{"custom_id": "a", "body": {"messages": []}}\n', "appears twice"),
    ('{"body": {"messages": []}}\n', "custom_id"),
])
def test_bad_request_file_is_one_line_before_any_request(tmp_path, bad, needle):
    (tmp_path / "in.jsonl").write_text(bad, encoding="utf-8")
    r = run("run", str(tmp_path / "in.jsonl"), "--model", "sim", "--base-url", "http://127.0.0.1:9/v1",
            "--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path / "o.jsonl"), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
