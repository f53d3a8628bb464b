"""pytrec_eval beside the project's metrics: every per-query value of a study's records checked against it, and
the TREC files of `export trec` read back as pytrec_eval takes them."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from evaluator.analysis.metric_defs import RANK_METRICS
from evaluator.analysis.metrics import record_obs
from evaluator.results.schema import GOLDS, Record


def _key(r: Record) -> str:
    return f"{r.model}/{r.run}/{r.subset}/{r.query_id}"  # each (model, run) ranks every query once


def _pytrec(records: list[Record], arch: str, gold: str, ks: list[int]) -> dict[str, dict[str, float]]:
    """pytrec_eval's per-query measures of one architecture's lists (each list cut to k for MRR)."""
    pytrec_eval = pytest.importorskip("pytrec_eval")
    qrels = {_key(r): {d: 1 for d in r.gold_set(gold)} for r in records}
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for k in ks:
        run = {}
        for r in records:
            b = r.block(arch)
            ids = b.unique_retrieved[:k] if b is not None else []
            # scores strictly decreasing in the record's order: the tool must not re-order
            run[_key(r)] = {d: float(len(ids) - i) for i, d in enumerate(ids)} or {"none": 0.0}
        ev = pytrec_eval.RelevanceEvaluator(qrels, {f"ndcg_cut.{k}", "recip_rank", f"P.{k}", f"recall.{k}"})
        for q, m in ev.evaluate(run).items():
            out[q] |= {("ndcg", k): m[f"ndcg_cut_{k}"], ("mrr", k): m["recip_rank"], ("precision", k): m[f"P_{k}"],
                       ("recall", k): m[f"recall_{k}"], ("comp", k): float(m[f"recall_{k}"] == 1.0)}
    return out


def check_per_query(records: list[Record], ks: list[int]) -> int:
    """Every per-query rank metric, recall and precision of RtP and PtR in `records` against pytrec_eval's: how many
    values were checked."""
    checked = 0
    for arch in ("rtp", "ptr"):
        for gold in GOLDS:
            recs = [r for r in records if r.block(arch) is not None and r.gold_set(gold)
                    and not getattr(r.block(arch), "excluded", False)]
            ref = _pytrec(recs, arch, gold, ks)
            for r in recs:
                obs = record_obs(r, ks, ks[0])
                for k in ks:
                    for metric in (*RANK_METRICS, "recall", "precision"):
                        mine = obs[(arch, metric, k, gold)][0]
                        theirs = ref[_key(r)][(metric, k)]
                        assert mine == pytest.approx(theirs, abs=1e-9), (r.subset, r.query_id, arch, gold, metric, k)
                        checked += 1
    return checked


def read_run(path: Path) -> dict[str, dict[str, float]]:
    """A TREC run file (`qid Q0 doc rank score tag`, the tag its file's stem) as pytrec_eval takes it."""
    run: dict[str, dict[str, float]] = defaultdict(dict)
    for line in path.read_text(encoding="utf-8").splitlines():
        q, q0, doc, rank, score, tag = line.split(" ")
        assert q0 == "Q0" and tag == path.stem
        run[q][doc] = float(score)
    return run


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """A TREC qrels file (`qid 0 doc relevance`) as pytrec_eval takes it."""
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    for line in path.read_text(encoding="utf-8").splitlines():
        q, _, doc, rel = line.split(" ")
        qrels[q][doc] = int(rel)
    return qrels
