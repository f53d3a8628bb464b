"""Every count a user gives has an upper bound, or a memory cost that stays bounded (issue 38).

Before the fix `--runs 100000000 --dry-run` grew past 18 GB before it was stopped, `--runs 1000000` segfaulted
under a 3 GB limit, and a dry run held every call's body. Now each count flag stops past its bound with one line,
before any work, and the dry run sums the calls as they go by (a 64-bit digest kept per distinct request).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from data_fixtures import make_data_dir

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evaluator.app.dry_run import plan_requests  # noqa: E402
from evaluator.batch.request_format import Request  # noqa: E402
from evaluator.cli import main as cli  # noqa: E402
from evaluator.llm import load_profile  # noqa: E402

LIMIT = 3 * 2**30  # the address space of the child: the campaign's 3 GB


def _limited(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("EVALUATOR_DATA", None)
    return subprocess.run([sys.executable, "-m", "evaluator", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, preexec_fn=limit)


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_a_dry_run_far_past_the_runs_bound_is_one_line_under_a_memory_limit(tmp_path):
    data = make_data_dir(tmp_path / "data")
    base = ["--data", str(data), "--model", "sim", "--dry-run", "--no-progress", "--cache-dir", str(tmp_path / "c")]
    far = _limited([*base, "--runs", "100000000", "--out", str(tmp_path / "far")], tmp_path)
    assert far.returncode == 2 and _one_line(far.stderr) == ("error: --runs 100000000 is impossible; it must be "
                                                              "between 1 and 1000"), far.stderr
    assert not (tmp_path / "far").exists() and not (tmp_path / "c").exists()  # stopped before any work
    # At the bound the dry run counts every call within the same limit.
    at = _limited([*base, "--runs", "1000", "--limit", "1", "--out", str(tmp_path / "at")], tmp_path)
    assert at.returncode == 0, at.stderr[-2000:]
    plan = json.loads((tmp_path / "at" / "plan.json").read_text())["models"]["sim"]
    assert plan["calls"] == 2 * 1000 * 3 and plan["to_send"] == 2 * 1000 * 3  # 2 queries x 1000 runs x 3 calls


@pytest.mark.parametrize(("args", "said"), [
    (["--runs", "1001"], "--runs 1001 is impossible; it must be between 1 and 1000"),
    (["--k", "101"], "--k 101 is impossible; it must be between 1 and 100"),
    (["--ks", "1,5,1000"], "every value must be between 1 and 100"),
    (["--ks", ",".join(map(str, range(1, 41)))], "it must be at most 32 values long"),
    (["--concurrency", "100000"], "--concurrency 100000 is impossible; it must be between 1 and 1024"),
    (["--rpm", "inf"], "--rpm inf is impossible; it must be a finite number"),
    (["--tpm", "1e12"], "--tpm 1000000000000.0 is impossible"),
    (["--max-tokens", "99999999"], "--max-tokens 99999999 is impossible; it must be between 1 and 1048576"),
    (["--timeout", "1e9"], "--timeout 1000000000.0 is impossible; it must be between 0 and 86400"),
    (["--stop-grace", "1e9"], "--stop-grace 1000000000.0 is impossible"),
    (["view", "OUT", "--port", "99999"], "--port: expected an integer from 0 to 65,535"),
    (["requests", "run", "in.jsonl", "--model", "sim", "--out", "r.jsonl", "--engine", "ray", "--actors", "100000"],
     "--actors: expected an integer from 1 to 256"),
])
def test_every_count_has_a_bound_past_which_it_is_one_line(args, said, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("OUT", str(tmp_path)) for a in args]
    if argv[0] not in ("view", "requests"):
        argv += ["--out", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")]
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and said in _one_line(err), err
    assert not (tmp_path / "o").exists() and not (tmp_path / "c").exists()


def test_the_dry_run_keeps_no_call_body(tmp_path):
    """The plan of a request file sums its calls: what it holds grows by a digest per request, not by the request
    (each body here is ~2 KB; held, 2,000 of them would be ~4 MB)."""
    profile = load_profile("sim")

    def peak(n: int) -> int:
        requests = [Request(f"r{i}", {"messages": [{"role": "user", "content": f"{i} " + "x" * 2000}],
                                      "max_tokens": 64}) for i in range(n)]
        tracemalloc.start()
        plan = plan_requests(requests, profile, tmp_path / "cache")
        got = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert plan.models[0].to_send == n
        return got

    small, large = peak(200), peak(2200)
    assert (large - small) / 2000 < 250, (small, large)  # bytes per extra request (~96; ~500 when bodies were held)
