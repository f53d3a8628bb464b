"""Every count a user gives has an upper bound, or a memory cost that stays bounded (issue 38).

Before the fix `--runs 100000000 --dry-run` grew past 18 GB before it was stopped, `--runs 1000000` segfaulted
under a 3 GB limit, and a dry run held every call's body. Now each count flag stops past its bound with one line,
before any work, and the dry run sums the calls as they go by (a 64-bit digest kept per distinct request).
"""

from __future__ import annotations

import tracemalloc

import pytest
from helpers.cli import one_line

from evaluator.app.dry_run import plan_requests
from evaluator.batch.request_format import Request
from evaluator.cli import main as cli
from evaluator.llm import load_profile


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
def test_every_count_has_a_bound_past_which_it_isone_line(args, said, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("OUT", str(tmp_path)) for a in args]
    if argv[0] not in ("view", "requests"):
        argv += ["--out", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")]
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and said in one_line(err), err
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
