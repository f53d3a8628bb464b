"""Routing study on synthetic records: limits equal the always-policies, held-out choices never see the
queries they are scored on, and the command writes its outputs with no endpoint reachable."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import numpy as np
import pytest

from evaluator.analysis import routing_study as R
from evaluator.cli.main import main as cli
from evaluator.results.schema import as_records

K = 5
RUNS = 3
SUBSETS = {"G1_instruction": 16, "G2_instruction": 12, "G3_instruction": 10}


def _ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}::api{i}" for i in range(n)]


def make_records(runs: int = RUNS) -> list[dict]:
    """G1: high RtP score, RtP finds the gold; G2/G3: low score, PtR finds more. Noise keeps it honest."""
    recs = []
    for subset, n in SUBSETS.items():
        simple = subset.startswith("G1")
        for qid in range(n):
            rq = random.Random(f"{subset}|{qid}")
            gold = _ids(f"{subset}{qid}", 4)
            score = rq.uniform(0.6, 0.9) if simple else rq.uniform(0.3, 0.7)
            rtp_hits = rq.randint(2, 4) if simple else rq.randint(0, 2)
            text = "Find the weather." if simple else "Find flights and also book a hotel, then rent a car."
            for run in range(runs):
                rr = random.Random(f"{subset}|{qid}|{run}")
                ptr_hits = rr.randint(0, 2) if simple else rr.randint(1, 4)
                recs.append({
                    "model": "sim", "run": run, "subset": subset, "query_id": qid, "query": text + f" q{qid}",
                    "gold": {"api_list": gold, "relevant": gold[:2]},
                    "rtp": {"retrieved": gold[:rtp_hits] + _ids("noise", 20)[: 20 - rtp_hits],
                            "scores": [score - 0.01 * i for i in range(20)], "plan": None,
                            "tokens": {"planner": {"prompt": 300 + qid, "completion": 40}}},
                    "ptr": {"stubs": [{"name": "a", "reasoning": "b"}], "discovery_parse_error": None,
                            "discovery_llm_error": "HTTP 500" if (qid == 3 and run == 1) else None,
                            "fallback": False, "retrieved": gold[:ptr_hits] + _ids("other", 20)[: 20 - ptr_hits],
                            "scores": [0.8] * 20, "plan": None,
                            "tokens": {"discovery": {"prompt": 150, "completion": 60 + run},
                                       "planner": {"prompt": 310 + qid, "completion": 45}}},
                })
    return recs


def write_output(tmp_path: Path, recs: list[dict]) -> Path:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    with open(out / "queries.jsonl", "w") as fh:
        for r in recs:
            fh.write(json.dumps(r) + "\n")
    meta = {"k": K, "simulated": True, "models": [{"name": "sim", "simulated": True}], "runs": RUNS,
            "embedder": "sentence-transformers/all-MiniLM-L6-v2"}
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def _by_hand(recs: list[dict], arch: str, gold: str = "api_list") -> tuple[float, float]:
    """Mean over runs of the per-run mean recall and tokens, skipping failed discovery calls."""
    rec_runs, tok_runs = [], []
    for run in range(RUNS):
        rs = [r for r in recs if r["run"] == run and not r["ptr"]["discovery_llm_error"]]
        g = [set(r["gold"][gold]) for r in rs]
        rec_runs.append(np.mean([len(set(r[arch]["retrieved"][:K]) & gi) / len(gi) for r, gi in zip(rs, g, strict=True)]))
        tok_runs.append(np.mean([sum(c["prompt"] + c["completion"] for c in r[arch]["tokens"].values()) for r in rs]))
    return float(np.mean(rec_runs)), float(np.mean(tok_runs))


def test_threshold_limits_are_the_always_policies() -> None:
    recs = make_records()
    d = R.model_data(as_records(recs), "sim", K)
    assert d.excluded == len(SUBSETS)  # query 3 of each subset: failed discovery call in run 1
    pts = R.sweep(d, "score")
    (t_lo, lo), (t_hi, hi) = pts[0], pts[-1]
    # RtP when score >= tau: tau = -inf sends everything to RtP, tau = +inf everything to PtR.
    assert t_lo == -np.inf and lo.to_rtp == 1.0
    assert t_hi == np.inf and hi.to_rtp == 0.0
    for outcome, arch in ((lo, "rtp"), (hi, "ptr")):
        recall, tokens = _by_hand(recs, arch)
        assert outcome.mean("recall:api_list") == pytest.approx(recall)
        assert outcome.mean("tokens") == pytest.approx(tokens)
    b = R.baselines(d, "api_list")
    assert b.always_rtp.mean("recall:api_list") == pytest.approx(lo.mean("recall:api_list"))
    assert b.always_ptr.mean("tokens") == pytest.approx(hi.mean("tokens"))
    # Proxies route the other way round: RtP when the query is short.
    words = R.sweep(d, "words")
    assert words[0][1].to_rtp == 0.0 and words[-1][1].to_rtp == 1.0


def test_routing_beats_both_always_policies_here_and_saves_tokens() -> None:
    d = R.model_data(as_records(make_records()), "sim", K)
    tau, best = R.choose(R.sweep(d, "score"), "api_list")
    b = R.baselines(d, "api_list")
    assert best.mean("recall:api_list") >= max(b.always_rtp.mean("recall:api_list"),
                                               b.always_ptr.mean("recall:api_list"))
    assert best.mean("tokens") < b.always_ptr.mean("tokens")
    assert b.oracle.choice == {"G1_instruction": "rtp", "G2_instruction": "ptr", "G3_instruction": "ptr"}


def test_subset_split_never_looks_at_the_test_queries() -> None:
    recs = make_records()
    d = R.model_data(as_records(recs), "sim", K)
    train, test = R.split_masks(d, ["G1_instruction", "G2_instruction"], ["G3_instruction"])
    assert train.sum() == 28 and test.sum() == 10 and not (train & test).any()
    before = R.heldout_split(d, "score", "api_list", train, test)
    # Rewrite G3 completely: other scores, and RtP now perfect there. The chosen tau must not move.
    changed = copy.deepcopy(recs)
    for r in changed:
        if r["subset"] == "G3_instruction":
            r["rtp"]["scores"] = [0.99 - 0.001 * i for i in range(20)]
            r["rtp"]["retrieved"] = r["gold"]["api_list"] + r["rtp"]["retrieved"][4:]
    after = R.heldout_split(R.model_data(as_records(changed), "sim", K), "score", "api_list", train, test)
    assert after.tau == before.tau
    assert after.train == before.train
    assert after.test != before.test  # the test score does see them


def test_cross_validation_folds_never_choose_on_themselves() -> None:
    recs = make_records()
    d = R.model_data(as_records(recs), "sim", K)
    folds = R.fold_ids(d, 4, seed=1)
    assert np.array_equal(folds, R.fold_ids(d, 4, seed=1))  # seeded
    for sub in SUBSETS:  # stratified: every fold holds queries of every subset
        assert set(folds[d.subsets == sub].tolist()) == {0, 1, 2, 3}
    before = R.cross_validate(d, "score", "api_list", folds)
    target = 2
    keys = {d.keys[i] for i in np.flatnonzero(folds == target)}
    changed = copy.deepcopy(recs)
    for r in changed:
        if (r["subset"], r["query_id"]) in keys:  # fold 2's queries become RtP-perfect with odd scores
            r["rtp"]["scores"] = [0.05 - 0.001 * i for i in range(20)]
            r["rtp"]["retrieved"] = r["gold"]["api_list"] + r["rtp"]["retrieved"][4:]
    after = R.cross_validate(R.model_data(as_records(changed), "sim", K), "score", "api_list", folds)
    assert after.taus[target] == before.taus[target]


def test_proxies() -> None:
    assert R.word_count("Find the weather in Paris.") == 5
    assert R.clause_count("Find the weather.") == 1
    assert R.clause_count("Find flights and also book a hotel. Then rent a car!") >= 3


def test_command_writes_outputs_without_any_endpoint(tmp_path: Path, no_network: None) -> None:
    out = write_output(tmp_path, make_records())
    assert cli(["routing", str(out), "--folds", "3", "--seed", "2"]) == 0
    res = json.loads((out / "routing.json").read_text())
    m = res["models"]["sim"]
    assert set(m["sweeps"]) == {"score", "words", "clauses"}
    assert set(m["heldout"]["api_list"]) == {"subset_split", "cv"}
    assert len(m["heldout"]["relevant"]["cv"]["score"]["taus"]) == 3
    md = (out / "report.md").read_text()
    assert "SIMULATED LLM" in md and "G1_instruction+G2_instruction → G3_instruction" in md and "3-fold CV" in md and "per-subset oracle" in md
    assert (out / "figures" / "routing.png").stat().st_size > 1000


def test_retrieval_only_output_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recs = [dict(r, model=None, run=0) for r in make_records(1)]
    for r in recs:
        r.pop("ptr")
    out = write_output(tmp_path, recs)
    assert cli(["routing", str(out)]) == 2
    assert "no PtR records" in capsys.readouterr().err


def test_a_sweep_scores_each_threshold_exactly_as_one_policy_alone() -> None:
    """The sweep scores every threshold in one array operation; each value must equal, bit for bit,
    the per-run mean of the chosen architecture's values (numpy's own 1-D mean), so routing.json does
    not change with how the sweep is computed."""
    d = R.model_data(as_records(make_records()), "sim", K)
    sel = d.subsets != "G3_instruction"
    for signal in ("score", "words"):
        for tau, outcome in R.sweep(d, signal, sel):
            to_rtp = R.route(d.signals[signal], tau, R.SIGNALS[signal][1])
            for name in d.rtp:
                expect = [float(np.where(to_rtp, d.rtp[name][j], d.ptr[name][j])[sel & d.valid[j]].mean())
                          for j in range(len(d.runs)) if (sel & d.valid[j]).any()]
                assert outcome.values[name] == expect, (signal, tau, name)
            assert outcome.to_rtp == float(to_rtp[sel].mean())
