"""`--budget USD`: the run stops before it could spend more, says so in one line (exit 4), and a rerun with a
larger budget resumes without paying for any reply twice.

The spend is priced from the SIMULATOR's own token counts (`/stats`), not from the client's accounting,
and "paid twice" is the simulator's count of request bodies it answered more than once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.cli import run_cli
from helpers.study import study_args, workspace

from simulator.harness import batch_stats, configure_batch, reset_batch_stats

# configs/models/sim.toml's illustrative prices, USD per 1M tokens
PRICE_IN, PRICE_OUT = 0.15, 0.60


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    with workspace(tmp_path_factory.mktemp("budget")) as w:
        yield w


def study(ws, cache: Path, out: Path, *extra: str) -> list[str]:
    return study_args(ws, cache, out, *extra)


def sim_usd(stats: dict) -> float:
    return (stats["prompt_tokens"] * PRICE_IN + stats["completion_tokens"] * PRICE_OUT) / 1e6


def test_the_budget_stops_the_run_and_a_larger_one_resumes_it_paying_nothing_twice(ws):
    root, _, sim = ws
    sim.reset_stats()
    budget = 0.002  # about a third of what the 60 calls cost (sim.toml prices, max_tokens 1024)
    r = run_cli(*study(ws, root / "c", root / "o1", "--budget", str(budget)), cwd=root)
    assert r.returncode == 4, r.stderr
    stop = [ln for ln in r.stderr.splitlines() if ln.startswith("budget reached")]
    assert len(stop) == 1 and r.stderr.rstrip().endswith(stop[0]) and "Traceback" not in r.stderr, r.stderr
    assert "Still to send: sim " in stop[0] and "larger --budget" in stop[0]
    first = sim.stats()
    assert first["ok"] > 0 and sim_usd(first) <= budget  # the provider's own count never passes the cap
    assert not (root / "o1" / "queries.jsonl").exists()  # a stopped run writes no partial results

    r = run_cli(*study(ws, root / "c", root / "o2", "--budget", "1"), cwd=root)
    assert r.returncode == 0, r.stderr
    both = sim.stats()
    assert both["repeated_ok"] == 0  # no request body was answered (paid) twice across the two runs
    sim.reset_stats()
    r = run_cli(*study(ws, root / "c-ref", root / "ref"), cwd=root)  # the same study in one go, no budget
    assert r.returncode == 0, r.stderr
    assert both["ok"] == sim.stats()["ok"]  # stopped + resumed paid for exactly the calls of one full run
    assert (root / "o2" / "summary.json").read_text() == (root / "ref" / "summary.json").read_text()


def test_batch_mode_checks_the_budget_before_submitting_a_batch(ws):
    root, _, sim = ws
    configure_batch(sim.base_url, reset=True, turnaround_s=0.1)
    reset_batch_stats(sim.base_url)
    sim.reset_stats()
    # Round 1 is one batch of 40 requests whose worst case (max_tokens 1,024 each, half price) is ~$0.013.
    r = run_cli(*study(ws, root / "cbat", root / "obat", "--batch", "--budget", "0.005"), cwd=root)
    assert r.returncode == 4, r.stderr
    assert r.stderr.rstrip().splitlines()[-1].startswith("budget reached")
    assert batch_stats(sim.base_url)["batches_created"] == 0 and sim.stats()["requests"] == 0  # nothing submitted

    r = run_cli(*study(ws, root / "cbat", root / "obat2", "--batch", "--budget", "1"), cwd=root)
    assert r.returncode == 0, r.stderr
    st = batch_stats(sim.base_url)
    assert st["batches_created"] >= 2 and st["repeated_ok"] == 0 and sim.stats()["requests"] == 0
