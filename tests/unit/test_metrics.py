"""Per-query metrics: hand-checked records, ranx cross-check, error and retrieval-only handling."""

from __future__ import annotations

import warnings

import pytest
from helpers import records as F

from evaluator.analysis import metrics as M
from evaluator.results.schema import GOLDS, Record

GOLD = ["T::a", "T::b", "T::c", "T::d"]
REL = ["T::a", "T::b"]


def _rec(**kw: object) -> dict:
    rtp_ret = ["T::a", "X::1", "X::2", "T::c", "X::3", "T::b"]
    ptr = F.ptr_block(
        ["get_a", "Get_A ", "find_x"],
        [["T::a", "X::9"], ["X::9", "T::a"], ["T::d"]],
        ["X::9", "T::a", "T::d", "X::8", "X::7", "T::b"],
        F.plan(["X::9", "T::a", "Outside::api"], 4),
        stub_scores=[[0.9, 0.5], [0.7, 0.6], [0.6]],
        width={"1": 2, "5": 7},
    )
    rec = F.record("sim", 0, "G1_instruction", 1, api_list=GOLD, relevant=REL, rtp_retrieved=rtp_ret,
                   rtp_plan=F.plan(["T::a", "T::a"], 3), ptr=ptr)
    rec.update(kw)
    return rec


def obs_of(rec: dict, *args: object, **kw: object) -> M.Obs:
    return M.record_obs(Record.from_dict(rec), *args, **kw)  # records as queries.jsonl holds them


def test_retrieval_by_hand() -> None:
    obs = obs_of(_rec(), ks=[1, 3, 5], k=5)
    # RtP top-5 = a, X1, X2, c, X3: 2 of 4 api_list gold, 1 of 2 relevant
    assert obs[("rtp", "recall", 5, "api_list")] == (0.5, 1.0)
    assert obs[("rtp", "precision", 5, "api_list")] == (2 / 5, 1.0)
    assert obs[("rtp", "recall", 5, "relevant")] == (0.5, 1.0)
    assert obs[("rtp", "recall", 1, "api_list")] == (0.25, 1.0)
    assert obs[("rtp", "precision", 3, "api_list")] == (1 / 3, 1.0)
    assert obs[("ptr", "recall", 1, "api_list")] == (0.0, 1.0)
    assert obs[("ptr", "miss", 1, "relevant")] == (1.0, 1.0)
    assert obs[("ptr", "recall", 5, "api_list")] == (0.5, 1.0)


def test_planner_and_cross_by_hand() -> None:
    obs = obs_of(_rec(), ks=[1, 3, 5], k=5)
    assert obs[("rtp", "pass", 5, None)] == (1.0, 1.0)
    assert obs[("rtp", "apis_named", 5, None)] == (1.0, 1.0)  # duplicate selection counted once
    assert obs[("rtp", "selection_rate", 5, None)] == (1 / 5, 1.0)
    assert obs[("rtp", "fidelity", 5, None)] == (1.0, 1.0)
    # PtR selected X9, a (both in R) and one outside: fidelity 2/3, selection rate 2/5
    assert obs[("ptr", "fidelity", 5, None)] == pytest.approx((2 / 3, 1.0))
    assert obs[("ptr", "selection_rate", 5, None)] == (2 / 5, 1.0)
    assert obs[("ptr", "plan_steps", 5, None)] == (4.0, 1.0)
    # Jaccard {a} vs {X9, a, Outside} = 1/3; top-5 sets differ
    assert obs[("both", "jaccard_selected", 5, None)] == pytest.approx((1 / 3, 1.0))
    assert obs[("both", "divergent", 5, None)] == (1.0, 1.0)
    assert obs[("both", "both_refused", 5, None)] == (0.0, 1.0)
    assert obs[("both", "recall_tie", 5, "api_list")] == (1.0, 1.0)  # 0.5 each
    assert obs[("both", "recall_win_rtp", 1, "api_list")] == (1.0, 1.0)  # RtP's top-1 is gold
    assert obs[("both", "recall_win_ptr", 1, "api_list")] == (0.0, 1.0)
    assert obs[("rtp", "tokens_total", 5, None)] == (860.0, 1.0)
    assert obs[("ptr", "tokens_discovery_completion", 5, None)] == (120.0, 1.0)
    assert obs[("ptr", "tokens_total", 5, None)] == (150.0 + 120 + 820 + 70, 1.0)


def test_stub_metrics_pooled() -> None:
    obs = obs_of(_rec(), ks=[1, 5], k=5)
    assert obs[("ptr", "gen", None, None)] == (1.0, 1.0)
    assert obs[("ptr", "stubs_per_query", None, None)] == (3.0, 1.0)
    # top-1 per stub: a (gold), X9 (not), d (api_list gold, not relevant)
    assert obs[("ptr", "stub_match", None, "api_list")] == (2.0, 3.0)
    assert obs[("ptr", "stub_match", None, "relevant")] == (1.0, 3.0)
    assert obs[("ptr", "stub_cos_correct", None, "api_list")] == pytest.approx((1.5, 2.0))
    assert obs[("ptr", "stub_cos_incorrect", None, "api_list")] == pytest.approx((0.7, 1.0))
    assert obs[("ptr", "width", 5, None)] == (7.0, 1.0)
    assert ("ptr", "width", 3, None) not in obs  # not recorded -> not observed
    names = Record.from_dict(_rec()).ptr.stub_names
    assert names == ["get_a", "get_a", "find_x"]
    assert M.unique_ratio(len(set(names)), len(names)) == pytest.approx(2 / 3)
    assert M.unique_ratio(0, 0) is None


def test_refusal_parse_error_and_llm_error() -> None:
    miss_ret = ["X::1", "X::2", "X::3", "X::4", "X::5"]
    rec = F.record("sim", 0, "G2_instruction", 2, api_list=GOLD, relevant=REL, rtp_retrieved=miss_ret,
                   rtp_plan=F.plan([], 1))
    obs = obs_of(rec)
    assert obs[("rtp", "pass", 5, None)] == (0.0, 1.0)
    assert ("rtp", "fidelity", 5, None) not in obs  # undefined without a selection
    assert obs[("rtp", "miss_refused", 5, "api_list")] == (1.0, 1.0)
    assert obs[("rtp", "miss_wrong_tool", 5, "api_list")] == (0.0, 1.0)

    rec["rtp"]["plan"] = F.plan([], 0, parse_error="bad json")
    obs = obs_of(rec)
    assert obs[("rtp", "pass", 5, None)] == (0.0, 1.0)  # a parse error is a planner outcome
    assert obs[("rtp", "miss_refused", 5, "api_list")] == (0.0, 1.0)
    assert obs[("rtp", "planner_parse_error", None, None)] == (1.0, 1.0)

    rec["rtp"]["plan"] = F.plan([], 0, llm_error="HTTP 503")
    obs = obs_of(rec)
    assert ("rtp", "pass", 5, None) not in obs  # infrastructure failure: excluded
    assert obs[("rtp", "planner_llm_error", None, None)] == (1.0, 1.0)
    assert obs[("rtp", "recall", 5, "api_list")] == (0.0, 1.0)


def test_discovery_llm_error_excludes_ptr() -> None:
    rec = _rec()
    rec["ptr"]["discovery_llm_error"] = "timeout"
    obs = obs_of(rec)
    assert obs[("ptr", "discovery_llm_error", None, None)] == (1.0, 1.0)
    assert not any(key[0] == "ptr" and key[1] in ("recall", "pass", "gen") for key in obs)
    assert not any(key[0] == "both" for key in obs)


def test_jaccard_both_empty_is_one() -> None:
    rec = _rec()
    rec["rtp"]["plan"] = F.plan([])
    rec["ptr"]["plan"] = F.plan([])
    obs = obs_of(rec)
    assert obs[("both", "jaccard_selected", 5, None)] == (1.0, 1.0)
    assert obs[("both", "both_refused", 5, None)] == (1.0, 1.0)


def test_retrieval_only_record() -> None:
    rec = F.retrieval_only()[0]
    obs = obs_of(rec)
    assert {key[0] for key in obs} == {"rtp"}
    assert {key[1] for key in obs} == {"recall", "precision", "miss", "ndcg", "mrr", "comp", "n_queries"}


def test_against_ranx() -> None:
    ranx = pytest.importorskip("ranx")
    recs = F.retrieval_only({"G1_instruction": 12})
    ks = [1, 3, 5, 10, 20]
    for gold in GOLDS:
        qrels = ranx.Qrels({str(r["query_id"]): {d: 1 for d in r["gold"][gold]} for r in recs})
        run = ranx.Run({str(r["query_id"]): {d: 100.0 - i for i, d in enumerate(r["rtp"]["retrieved"])}
                        for r in recs})
        names = [f"{m}@{k}" for m in ("recall", "precision") for k in ks]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numba type-safety chatter
            ref = ranx.evaluate(qrels, run, names, return_mean=False, make_comparable=True)
        qids = list(qrels.keys())
        ours = {str(r["query_id"]): obs_of(r, ks) for r in recs}
        for name in names:
            metric, k = name.split("@")
            got = [ours[q][("rtp", metric, int(k), gold)][0] for q in qids]
            assert got == pytest.approx(list(ref[name]), abs=1e-9), (gold, name)
