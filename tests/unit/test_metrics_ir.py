"""NDCG@k, MRR@k, COMP@k (and recall, precision) per query against pytrec_eval, on real study outputs; the TREC
export read back by pytrec_eval gives the per-subset means the report prints; RRF against ranx."""

from __future__ import annotations

import math
import urllib.parse

import numpy as np
import pytest
from helpers import FIXTURES
from helpers.trec import check_per_query

from evaluator.analysis.metrics import rank_metrics
from evaluator.render import trec as TREC
from evaluator.results.schema import OutputDir
from evaluator.retrieval.retrievers import rrf

pytrec_eval = pytest.importorskip("pytrec_eval")

FIXTURE = FIXTURES / "release-0.1.0"


def test_rank_metrics_hand_checked() -> None:
    gold = {"a", "b", "c"}
    m = rank_metrics(["x", "a", "y", "b"], gold, 3)
    assert m["ndcg"] == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3) + 1 / math.log2(4)))
    assert m["mrr"] == 0.5 and m["comp"] == 0.0
    assert rank_metrics(["c", "b", "a", "x"], gold, 3) == {"ndcg": 1.0, "mrr": 1.0, "comp": 1.0}
    assert rank_metrics(["x", "y"], gold, 2) == {"ndcg": 0.0, "mrr": 0.0, "comp": 0.0}
    # ideal DCG over min(|G|, k): one gold item first at k = 5 is perfect, and COMP needs every gold item
    assert rank_metrics(["a", "x"], {"a"}, 5) == {"ndcg": 1.0, "mrr": 1.0, "comp": 1.0}


def test_per_query_metrics_equal_pytrec_eval_on_fixture() -> None:
    records = OutputDir(FIXTURE).read_records()
    assert check_per_query(records, [1, 3, 5, 10, 20]) > 500


def test_trec_ties_keep_the_records_order() -> None:
    out = TREC.strictly_decreasing([12.0, 12.0, 11.999999, 0.5, 0.5, 0.4])
    assert out[0] == 12.0 and out[3] == 0.5 and out[5] == 0.4 and abs(out[2] - 12.0) < 1e-4
    # strictly decreasing even as trec_eval reads them (single precision)
    assert all(np.float32(float(f"{a:.10g}")) > np.float32(float(f"{b:.10g}")) for a, b in zip(out, out[1:], strict=False))
    assert TREC.encode("Tool::get  forecast%x") == "Tool::get%20%20forecast%25x"
    assert urllib.parse.unquote(TREC.encode("a\u00a0b c")) == "a\u00a0b c"


def test_rrf_equals_ranx() -> None:
    ranx = pytest.importorskip("ranx")
    from ranx import fuse

    rng = np.random.default_rng(0)
    a = np.stack([rng.permutation(40)[:15] for _ in range(6)])
    b = np.stack([rng.permutation(40)[:15] for _ in range(6)])
    scores, rows = rrf([a, b], 12)
    runs = [ranx.Run({str(q): {str(d): float(15 - i) for i, d in enumerate(x[q])} for q in range(6)}) for x in (a, b)]
    fused = fuse(runs, method="rrf", params={"k": 60}).to_dict()
    for q in range(6):
        theirs = sorted(fused[str(q)].values(), reverse=True)[:12]
        assert scores[q].tolist() == pytest.approx(theirs)  # the same best 12 scores, in order
        for d, s in zip(rows[q], scores[q], strict=True):
            assert s == pytest.approx(fused[str(q)][str(d)])
