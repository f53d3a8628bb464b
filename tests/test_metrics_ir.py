"""NDCG@k, MRR@k, COMP@k (and recall, precision) per query against pytrec_eval, on real study outputs; the TREC
export read back by pytrec_eval gives the per-subset means the report prints; RRF against ranx."""

from __future__ import annotations

import math
import urllib.parse
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from study_fixtures import REPO, run_cli, study_args, workspace

from evaluator.analysis import stats as S
from evaluator.analysis.metric_defs import RANK_METRICS
from evaluator.analysis.metrics import rank_metrics, record_obs
from evaluator.cli import main as cli
from evaluator.render import trec as TREC
from evaluator.results.schema import GOLDS, OutputDir, Record
from evaluator.retrieval.retrievers import rrf

pytrec_eval = pytest.importorskip("pytrec_eval")

FIXTURE = REPO / "tests" / "fixtures" / "release-0.1.0"


@pytest.fixture(scope="module")
def hybrid_run(tmp_path_factory: pytest.TempPathFactory) -> OutputDir:
    """A small `--model sim` study with the hybrid retriever (dense and BM25 both searched)."""
    root = tmp_path_factory.mktemp("ir")
    with workspace(root) as ws:
        out = root / "out"
        done = run_cli(*study_args(ws, root / "cache", out, "--retriever", "hybrid", "--ks", "1,2,3,5,10",
                                   runs=2), cwd=root)
        assert done.returncode == 0, done.stderr[-2000:]
    return OutputDir(out)


def _key(r: Record) -> str:
    return f"{r.model}/{r.run}/{r.subset}/{r.query_id}"  # each (model, run) ranks every query once


def _pytrec(records: list[Record], arch: str, gold: str, ks: list[int]) -> dict[str, dict[str, float]]:
    """pytrec_eval's per-query measures of one architecture's lists (each list cut to k for MRR)."""
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


def _check_per_query(records: list[Record], ks: list[int]) -> int:
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
    assert _check_per_query(records, [1, 3, 5, 10, 20]) > 500


def test_per_query_metrics_equal_pytrec_eval_on_a_study(hybrid_run: OutputDir) -> None:
    records = hybrid_run.read_records()
    assert {r.retriever for r in records} == {"hybrid"}
    assert _check_per_query(records, [1, 2, 3, 5, 10]) > 500
    report = (hybrid_run.path / "report.md").read_text(encoding="utf-8")
    assert "- Retriever: `hybrid`" in report and "Table 1c: Rank metrics" in report


def _read_run(path: Path) -> dict[str, dict[str, float]]:
    run: dict[str, dict[str, float]] = defaultdict(dict)
    for line in path.read_text(encoding="utf-8").splitlines():
        q, q0, doc, rank, score, tag = line.split(" ")
        assert q0 == "Q0" and tag == path.stem
        run[q][doc] = float(score)
    return run


def _read_qrels(path: Path) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    for line in path.read_text(encoding="utf-8").splitlines():
        q, _, doc, rel = line.split(" ")
        qrels[q][doc] = int(rel)
    return qrels


def test_trec_export_gives_the_reports_means(hybrid_run: OutputDir, tmp_path: Path) -> None:
    to = tmp_path / "trec"
    assert cli.main(["export", "trec", str(hybrid_run.path), "--to", str(to)]) == 0
    records = hybrid_run.read_records()
    runs = sorted(p.name for p in to.glob("*.trec"))
    assert runs == sorted(f"sim.run{r}.{a}.hybrid.trec" for a in ("ptr", "rtp") for r in (0, 1))
    summary = S.summarize(records, [1, 2, 3, 5, 10], 5)
    checked = 0
    for gold in GOLDS:
        qrels = _read_qrels(to / f"qrels.{gold}.txt")
        for name in runs:
            model, run_s, arch, _ = Path(name).stem.split(".")
            run_i = int(run_s[3:])
            run = _read_run(to / name)
            measures = {"ndcg_cut.5", "recip_rank", "P.5", "recall.5"}
            per_q = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
            for subset in summary.subsets:
                qids = [q for q in qrels if urllib.parse.unquote(q).split("/")[0] == subset]
                # a query with no line scores 0 (trec_eval -c), as the report counts it
                for metric, m in (("ndcg", "ndcg_cut_5"), ("precision", "P_5"), ("recall", "recall_5")):
                    mean = float(np.mean([per_q.get(q, {}).get(m, 0.0) for q in qids]))
                    row = summary.row(None if arch == "rtp" else model, subset, arch, metric, 5, gold)
                    assert row is not None
                    want = row.values[0] if arch == "rtp" else row.values[run_i]
                    assert mean == pytest.approx(want, abs=1e-9), (name, subset, metric, gold)
                    checked += 1
    assert checked >= 2 * 4 * 2 * 3
    # the ids survive the encoding: an API id with spaces comes back whole
    ids = {urllib.parse.unquote(d) for line in (to / "qrels.api_list.txt").read_text().splitlines()
           for d in [line.split(" ")[2]]}
    assert ids <= {i for r in records for i in r.gold_set("api_list")} and any(" " in i for i in ids)


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


def test_viewer_shows_the_rank_metrics(hybrid_run: OutputDir) -> None:
    import json
    import re

    html = (hybrid_run.path / "view.html").read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S).group(1))
    by_key = {(r.subset, r.query_id, r.run): r for r in hybrid_run.read_records()}
    k = data["datasets"][0]["k"]
    seen = 0
    for v in data["records"]:
        q = data["queries"][v["q"]]
        rec = by_key[(q["subset"], q["id"], v["run"])]
        for arch in ("rtp", "ptr"):
            for i, gold in enumerate(GOLDS):
                want = rank_metrics(rec.block(arch).unique_retrieved, set(rec.gold_set(gold)), k)
                for m in RANK_METRICS:
                    assert v["rank"][arch][m][i] == pytest.approx(want[m], abs=1e-6)
                    seen += 1
    assert seen and any("Table 1c" in t["title"] for t in data["datasets"][0]["tables"])
    assert "Retriever" in html and "rankLine" in html
