"""`--dry-run`: the plan of a study (or a request file) with nothing sent, checked against the run that follows.

The simulator counts every request it receives (`/stats`) and bills tokens by the same rule the plan
uses, so "nothing sent" and the estimates are checked against an independent count, not the client's.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from helpers import REPO
from helpers.cli import run_cli
from helpers.study import study_args, workspace

from evaluator.study.prompts import DISCOVERY_MARKER, HYDE_MARKER, PLANNER_MARKER, REWRITE_MARKER


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    with workspace(tmp_path_factory.mktemp("dryrun")) as w:
        yield w


def study(ws, cache: Path, out: Path, runs: int = 4) -> list[str]:
    return study_args(ws, cache, out, runs=runs)


def read_plan(path: Path) -> dict:
    return json.loads(path.read_text())


def within(estimate: float, real: float, share: float) -> bool:
    return abs(estimate - real) <= share * real


def test_dry_run_sends_nothing_and_its_estimates_hold_for_the_run(ws):
    root, _, sim = ws
    cache = root / "cold"
    sim.reset_stats()
    r = run_cli(*study(ws, cache, root / "plan-cold"), "--dry-run", cwd=root)
    assert r.returncode == 0, r.stderr
    assert sim.stats()["requests"] == 0
    assert "nothing was sent" in r.stdout and "plan.json" in r.stdout
    plan = read_plan(root / "plan-cold" / "plan.json")
    assert plan["sent"] == 0
    m = plan["models"]["sim"]
    assert m["cached"] == 0 and m["ptr_planners_upper_bound"] > 0
    assert all("max_tokens" in why for why in m["completion_basis"].values())  # no history: the upper bound
    assert not (root / "plan-cold" / "queries.jsonl").exists()  # a plan, not a run

    r = run_cli(*study(ws, cache, root / "run-cold"), cwd=root)
    assert r.returncode == 0, r.stderr
    real = sim.stats()
    meta = json.loads((root / "run-cold" / "meta.json").read_text())
    cost = meta["cost"]["sim"]["online"]
    print(f"\ncold cache: plan {m['to_send']} requests / sim {real['requests']}; prompt tokens plan "
          f"{m['prompt_tokens']} / sim {real['prompt_tokens']}; completion plan {m['completion_tokens']} (max_tokens "
          f"bound) / sim {real['completion_tokens']}; USD plan {m['usd_online']} / run {cost['usd']}")
    assert within(m["to_send"], real["requests"], 0.10)
    assert m["calls"] == meta["llm_stats"]["sim"]["calls"] or within(m["calls"], meta["llm_stats"]["sim"]["calls"], 0.10)
    assert within(m["prompt_tokens"], real["prompt_tokens"], 0.10)
    assert m["completion_tokens"] >= real["completion_tokens"]  # max_tokens per call bounds it
    assert m["usd_online"] >= cost["usd"] > 0
    assert m["usd_batch"] == pytest.approx(m["usd_online"] * 0.5, rel=1e-3)  # sim.toml: batch_discount 0.5


def test_a_warm_cache_is_counted_and_gives_the_completion_estimate(ws):
    root, _, sim = ws
    cache = root / "warm"
    sim.reset_stats()
    r = run_cli(*study(ws, cache, root / "run-1", runs=1), cwd=root)  # run 0 cached
    assert r.returncode == 0, r.stderr
    first = sim.stats()
    sim.reset_stats()
    r = run_cli(*study(ws, cache, root / "plan-warm"), "--dry-run", cwd=root)
    assert r.returncode == 0, r.stderr
    assert sim.stats()["requests"] == 0
    m = read_plan(root / "plan-warm" / "plan.json")["models"]["sim"]
    assert m["cached"] == first["requests"]  # every reply of run 0 is found
    assert all("cached replies" in why for why in m["completion_basis"].values())

    r = run_cli(*study(ws, cache, root / "run-warm"), cwd=root)
    assert r.returncode == 0, r.stderr
    real = sim.stats()
    print(f"\nwarm cache (run 0 of 4 cached): plan {m['to_send']} requests / sim {real['requests']}; prompt "
          f"{m['prompt_tokens']} / {real['prompt_tokens']}; completion {m['completion_tokens']} / "
          f"{real['completion_tokens']}; USD {m['usd_online']}")
    assert within(m["to_send"], real["requests"], 0.10)
    assert within(m["prompt_tokens"], real["prompt_tokens"], 0.10)
    assert within(m["completion_tokens"], real["completion_tokens"], 0.25)


def test_dry_run_needs_no_api_key_and_prices_a_paid_model(ws):
    root, data, _ = ws
    args = ["--data", str(data), "--cache-dir", str(root / "gem"), "--out", str(root / "plan-gem"), "--model", "gemini",
            "--runs", "2", "--no-progress", "--no-extras", "--dry-run"]
    r = run_cli(*args, cwd=root)  # GEMINI_API_KEY unset, and no network here: a sent request would fail
    assert r.returncode == 0, r.stderr
    m = read_plan(root / "plan-gem" / "plan.json")["models"]["gemini"]
    assert m["usd_online"] > 0 and m["rpm"] == 1000 and m["time_floor_by"] in ("rpm", "tpm")
    assert "gemini" in r.stdout and "$" in r.stdout


def test_requests_run_dry_run_counts_the_cache_and_sends_nothing(ws):
    root, _, sim = ws
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"messages": [{"role": "system", "content": "Answer briefly."},
                                    {"role": "user", "content": f"Question number {i}: what is {i} + {i}?"}],
                       "max_tokens": 64}} for i in range(12)]
    req = root / "req.jsonl"
    req.write_text("".join(json.dumps(x) + "\n" for x in lines))
    half = root / "half.jsonl"
    half.write_text("".join(json.dumps(x) + "\n" for x in lines[:5]))
    common = ["--model", "sim", "--base-url", sim.base_url, "--cache-dir", str(root / "rq"), "--no-progress"]
    assert run_cli("requests", "run", str(half), "--out", str(root / "half-out.jsonl"), *common, cwd=root).returncode == 0
    sim.reset_stats()
    r = run_cli("requests", "run", str(req), "--out", str(root / "out.jsonl"), *common, "--dry-run", cwd=root)
    assert r.returncode == 0, r.stderr
    assert sim.stats()["requests"] == 0 and not (root / "out.jsonl").exists()
    m = read_plan(root / "out.plan.json")["models"]["sim"]
    assert (m["calls"], m["cached"], m["to_send"]) == (12, 5, 7)
    r = run_cli("requests", "run", str(req), "--out", str(root / "out.jsonl"), *common, cwd=root)
    assert r.returncode == 0, r.stderr
    real = sim.stats()
    assert real["requests"] == 7
    assert m["prompt_tokens"] == real["prompt_tokens"]  # the simulator bills by the same rule: exact


def test_dry_run_counts_each_architecture_and_requests_export_carries_their_calls(ws, tmp_path):
    # ~1 min on 2 loaded cores: three CLI runs (plan, run, export) of seven architectures on the tiny data, the
    # only end-to-end check that the collect pass (dry run, batch, export) sees every architecture's calls
    root, data, sim = ws
    cache = root / "seven"
    archs = "rtp,ptr,hyde,rewrite,fusion,route," + str(REPO / "examples" / "arch_plugin" / "clauses.py") + ":Clauses"
    r = run_cli(*study(ws, cache, root / "plan-seven", runs=1), "--archs", archs, "--dry-run", cwd=root)
    assert r.returncode == 0, r.stderr
    assert "calls by architecture: rtp " in r.stdout
    m = read_plan(root / "plan-seven" / "plan.json")["models"]["sim"]
    r = run_cli(*study(ws, cache, root / "run-seven", runs=1), "--archs", archs, cwd=root)
    assert r.returncode == 0, r.stderr
    meta = json.loads((root / "run-seven" / "meta.json").read_text())
    made = meta["runtime"]["arch_calls"]["sim"]
    assert set(m["by_arch"]) == {"rtp", "ptr", "hyde", "rewrite", "fusion", "route", "clauses"}
    print(f"\nby architecture: plan {m['by_arch']} / run {made}")
    for arch, n in made.items():
        assert within(m["by_arch"][arch], n, 0.10), arch
    # fusion and route reuse: fusion's only call is its planner, route makes none (its side's are counted there)
    assert m["by_arch"]["route"] == 0 and "route" not in made and made["fusion"] == made["rtp"]
    assert within(m["calls"], meta["llm_stats"]["sim"]["calls"], 0.10)
    # a request file for the batch API carries the new architectures' calls (first round: before any reply)
    ex = run_cli("requests", "export", str(tmp_path / "r.jsonl"), "--data", str(data), "--cache-dir",
                 str(tmp_path / "fresh"), "--model", "sim", "--runs", "1", "--archs", archs, "--no-progress", cwd=root)
    assert ex.returncode == 0, ex.stderr
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines() if x.strip()]
    systems = Counter(next(m["content"] for m in x["body"]["messages"] if m["role"] == "system").split("\n")[0]
                      for x in lines)
    n = len({json.dumps(x["body"]["messages"][-1]) for x in lines if HYDE_MARKER in json.dumps(x["body"])})
    assert systems[HYDE_MARKER] == systems[REWRITE_MARKER] == systems[DISCOVERY_MARKER] == n > 0
    assert systems[PLANNER_MARKER] > 0  # RtP's planners (and the plugin's, which needs no reply first)
