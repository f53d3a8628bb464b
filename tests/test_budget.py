"""`--budget USD`: the run stops before it could spend more, says so in one line (exit 4), and a rerun with a
larger budget resumes without paying for any reply twice.

The spend is priced from the SIMULATOR's own token counts (`/stats`), not from the client's accounting,
and "paid twice" is the simulator's count of request bodies it answered more than once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from study_fixtures import REPO, run_cli, study_args, workspace

from evaluator.core.money import capped_usd, cost_usd
from simulator.harness import batch_stats, configure_batch, reset_batch_stats

SIM_TOML = REPO / "configs" / "models" / "sim.toml"
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


@pytest.mark.parametrize("value", ["-1", "abc", "nan"])
def test_a_bad_budget_is_one_line(ws, value):
    root = ws[0]
    r = run_cli(*study(ws, root / "cb", root / "ob", "--budget", value), cwd=root)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "--budget" in r.stderr and "Traceback" not in r.stderr


def test_a_budget_in_the_config_is_checked(ws):
    root = ws[0]
    cfg = root / "neg.toml"
    cfg.write_text((REPO / "configs" / "default.toml").read_text().replace('out = ""', 'out = ""\nbudget_usd = -3'))
    r = run_cli("--config", str(cfg), *study(ws, root / "cb", root / "ob"), cwd=root)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "budget_usd" in r.stderr


def test_a_budget_on_a_profile_without_prices_is_one_line(ws):
    root, _, sim = ws
    toml = root / "noprice.toml"
    toml.write_text("".join(ln + "\n" for ln in SIM_TOML.read_text().splitlines() if not ln.startswith(("input_per_mtok", "output_per_mtok"))))
    sim.reset_stats()
    args = study(ws, root / "cb", root / "ob", "--budget", "5")
    args[args.index("sim")] = str(toml)
    r = run_cli(*args, cwd=root)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "price" in r.stderr and "noprice" in r.stderr
    assert sim.stats()["requests"] == 0


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


def test_one_price_rule_unknown_is_never_zero_and_the_batch_discount_applies_once():
    @dataclass
    class P:
        input_per_mtok: float | None = 1.0
        output_per_mtok: float | None = 2.0
        batch_discount: float | None = 0.5
        cached_input_per_mtok: float | None = None
        cache_write_per_mtok: float | None = None

    assert cost_usd(P(), 1_000_000, 1_000_000) == 3.0
    assert cost_usd(P(), 1_000_000, 1_000_000, batch=True) == capped_usd(P(), 1_000_000, 1_000_000, batch=True) == 1.5
    assert cost_usd(P(batch_discount=None), 1, 1, batch=True) is None  # the report says "unknown"
    assert capped_usd(P(batch_discount=None), 1_000_000, 0, batch=True) == 1.0  # a cap assumes no saving it can't see
    assert cost_usd(P(output_per_mtok=None), 1, 1) is None
    with pytest.raises(ValueError):  # a capped run checks prices first (check_priced): unpriced here is a bug
        capped_usd(P(input_per_mtok=None), 1, 1)
