"""NDCG@k, MRR@k, COMP@k (and recall, precision) per query against pytrec_eval on a study the CLI ran (the
hybrid retriever); its TREC export read back by pytrec_eval gives the per-subset means the report prints; the viewer
shows the rank metrics."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import run_cli
from helpers.study import study_args, workspace
from helpers.trec import check_per_query, read_qrels, read_run

from evaluator.analysis import stats as S
from evaluator.analysis.metric_defs import RANK_METRICS
from evaluator.analysis.metrics import rank_metrics
from evaluator.cli import main as cli
from evaluator.results.schema import GOLDS, OutputDir

pytrec_eval = pytest.importorskip("pytrec_eval")


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


def test_per_query_metrics_equal_pytrec_eval_on_a_study(hybrid_run: OutputDir) -> None:
    records = hybrid_run.read_records()
    assert {r.retriever for r in records} == {"hybrid"}
    assert check_per_query(records, [1, 2, 3, 5, 10]) > 500
    report = (hybrid_run.path / "report.md").read_text(encoding="utf-8")
    assert "- Retriever: `hybrid`" in report and "Table 1c: Rank metrics" in report


def test_trec_export_gives_the_reports_means(hybrid_run: OutputDir, tmp_path: Path) -> None:
    to = tmp_path / "trec"
    assert cli.main(["export", "trec", str(hybrid_run.path), "--to", str(to)]) == 0
    records = hybrid_run.read_records()
    runs = sorted(p.name for p in to.glob("*.trec"))
    assert runs == sorted(f"sim.run{r}.{a}.hybrid.trec" for a in ("ptr", "rtp") for r in (0, 1))
    summary = S.summarize(records, [1, 2, 3, 5, 10], 5)
    checked = 0
    for gold in GOLDS:
        qrels = read_qrels(to / f"qrels.{gold}.txt")
        for name in runs:
            model, run_s, arch, _ = Path(name).stem.split(".")
            run_i = int(run_s[3:])
            run = read_run(to / name)
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
