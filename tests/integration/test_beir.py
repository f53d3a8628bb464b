"""A whole study on a BEIR folder, as the CLI runs it: three architectures, the hybrid retriever, scaling and
routing; the report, graded NDCG per query equal to pytrec_eval's on the folder's qrels, the TREC export read back,
the viewer and its query page in a browser; the other architectures with BM25, a dry run, a dense retrieval-only run."""

from __future__ import annotations

import json
import random
import re
import shutil
import urllib.parse
from collections import defaultdict
from pathlib import Path

import pytest
from helpers import REPO
from helpers.beir import write_qrels
from helpers.browser import console_errors, go, open_page
from helpers.cli import run_cli

from evaluator.analysis import stats as S
from evaluator.analysis.metric_defs import RANK_METRICS
from evaluator.analysis.metrics import rank_metrics, record_obs
from evaluator.results.schema import OutputDir, Record

pytrec_eval = pytest.importorskip("pytrec_eval")

EXAMPLE = REPO / "examples" / "beir"


def graded_example(root: Path) -> tuple[Path, dict[str, dict[str, int]]]:
    """examples/beir with its test qrels re-graded (1-3 per gold tool, a score-0 judgement per query): (folder,
    the qrels as pytrec_eval reads them)."""
    folder = root / "toolset"
    shutil.copytree(EXAMPLE, folder)
    rng = random.Random(3)
    rows: list[tuple[str, str, int]] = []
    lines = (folder / "qrels" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]
    ids = [json.loads(line)["_id"] for line in (folder / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    for line in lines:
        q, d, _ = line.split("\t")
        rows.append((q, d, rng.choice([1, 2, 3])))
    for q in dict.fromkeys(q for q, _, _ in rows):
        rows.append((q, rng.choice([i for i in ids if (q, i) not in {(a, b) for a, b, _ in rows}]), 0))
    write_qrels(folder, rows)
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    for q, d, s in rows:
        qrels[q][d] = s
    return folder, dict(qrels)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The issue's command on a BEIR folder: `--model sim --archs rtp,ptr,hyde --retriever hybrid` (scaling and
    routing included), then the other architectures with BM25 and a dry run with dense, on one cache."""
    root = tmp_path_factory.mktemp("beir")
    folder, qrels = graded_example(root)
    common = ("--data", str(folder), "--subset-field", "metadata.subset", "--cache-dir", str(root / "cache"),
              "--no-progress")
    out = root / "out"
    r = run_cli(*common, "--model", "sim", "--archs", "rtp,ptr,hyde", "--retriever", "hybrid", "--runs", "2",
                "--ks", "1,3,5,10", "--out", str(out), cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    return {"root": root, "folder": folder, "qrels": qrels, "out": OutputDir(out), "common": common,
            "stderr": r.stderr}


def test_the_report_is_complete(study: dict) -> None:
    od: OutputDir = study["out"]
    report = (od.path / "report.md").read_text(encoding="utf-8")
    for part in ("Table 1: Recall", "Table 1c: Rank metrics", "Graded relevance (", "Table 3: Main results",
                 "NDCG hyde", "Table N1", "## Scaling study (Table 10)", "## Complexity-adaptive routing",
                 "Registry: 38 APIs (beir)", "`(title + \" \" + text).strip()`", "Gold: the BEIR folder's `qrels/test.tsv`",
                 "unjudged_query", "multi (n=", "single (n="):
        assert part in report, part
    assert "unjudged_query" in study["stderr"]  # the queries left out are counted on stderr too
    plans = [b.plan for r in od.read_records() for b in r.archs.values() if b.plan is not None]
    assert sum(bool(p.selected_offered) for p in plans) > len(plans) / 2  # the planner names documents by id
    meta = json.loads((od.path / "meta.json").read_text(encoding="utf-8"))
    assert meta["registry"]["format"] == "beir" and meta["settings"]["data"]["subset_field"] == "metadata.subset"
    assert meta["format_version"] == 5 and sum(meta["subsets"].values()) == len(study["qrels"])


def _ours(records: list[Record], arch: str, ks: list[int]) -> dict[tuple[str, int, str, int], float]:
    return {(r.model or "", r.run, str(r.query_id), k): record_obs(r, ks, ks[0])[(arch, "ndcg", k, "api_list")][0]
            for r in records if r.block(arch) is not None for k in ks}


def test_graded_ndcg_per_query_equals_pytrec_eval_on_the_folders_qrels(study: dict) -> None:
    records = study["out"].read_records()
    assert {r.retriever for r in records} == {"hybrid"} and {tuple(r.arch_names) for r in records} == {("rtp", "ptr", "hyde")}
    qrels = study["qrels"]
    graded = [r for r in records if r.grades]
    assert graded and all(r.grades == {d: s for d, s in qrels[str(r.query_id)].items() if s > 0} for r in graded)
    ks = [1, 3, 5, 10]
    checked = 0
    for arch in ("rtp", "ptr", "hyde"):
        mine = _ours(records, arch, ks)
        for r in records:
            ids = r.block(arch).unique_retrieved  # type: ignore[union-attr]
            run = {str(r.query_id): {d: float(len(ids) - i) for i, d in enumerate(ids)} or {"none": 0.0}}
            ev = pytrec_eval.RelevanceEvaluator({str(r.query_id): qrels[str(r.query_id)]},
                                                {f"ndcg_cut.{k}" for k in ks})
            theirs = ev.evaluate(run)[str(r.query_id)]
            for k in ks:
                assert mine[(r.model or "", r.run, str(r.query_id), k)] == pytest.approx(theirs[f"ndcg_cut_{k}"], abs=1e-9)
                checked += 1
    assert checked >= 3 * 2 * len(qrels) * len(ks)


def _read(path: Path, qrels: bool) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = line.split(" ")
        if qrels:
            out[cells[0]][cells[2]] = int(cells[3])
        else:
            out[cells[0]][cells[2]] = float(cells[4])
    return out


@pytest.mark.parametrize("bare", [False, True])
def test_the_trec_export_reads_back_in_pytrec_eval(study: dict, tmp_path: Path, bare: bool) -> None:
    od: OutputDir = study["out"]
    to = tmp_path / "trec"
    r = run_cli("export", "trec", str(od.path), "--to", str(to), *(["--bare-qids"] if bare else []), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    records = od.read_records()
    qrels = _read(to / "qrels.api_list.txt", qrels=True)
    # the grades written back: every judgement of the folder with a score > 0, under its qid
    key = (lambda q: urllib.parse.unquote(q)) if bare else (lambda q: urllib.parse.unquote(q).split("/", 1)[1])
    assert {key(q): dict(v) for q, v in qrels.items()} == {
        q: {d: s for d, s in j.items() if s > 0} for q, j in study["qrels"].items()}
    summary = S.summarize(records, [1, 3, 5, 10], 5)
    runs = sorted(p for p in to.glob("*.trec"))
    assert [p.name for p in runs] == sorted(f"sim.run{n}.{a}.hybrid.trec" for a in ("rtp", "ptr", "hyde") for n in (0, 1))
    checked = 0
    for path in runs:
        _, run_s, arch, _ = path.stem.split(".")
        run = _read(path, qrels=False)
        # bare qids meet the folder's own qrels (score 0 judgements included) as they stand
        judged = study["qrels"] if bare else qrels
        per_q = pytrec_eval.RelevanceEvaluator(judged, {"ndcg_cut.5", "recall.5"}).evaluate(run)
        for subset in summary.subsets:
            qids = [q for q in qrels if any(key(q) == str(x.query_id) and x.subset == subset for x in records)]
            for metric, m in (("ndcg", "ndcg_cut_5"), ("recall", "recall_5")):
                mean = sum(per_q.get(key(q) if bare else q, {}).get(m, 0.0) for q in qids) / len(qids)
                row = summary.row(None if arch == "rtp" else "sim", subset, arch, metric, 5, "api_list")
                assert row is not None
                want = row.values[0] if arch == "rtp" else row.values[int(run_s[3:])]
                assert mean == pytest.approx(want, abs=1e-9), (path.name, subset, metric)
                checked += 1
    assert checked == len(runs) * 2 * len(summary.subsets)


def test_bare_qids_are_refused_when_two_subsets_share_an_id(study: dict, tmp_path: Path) -> None:
    od: OutputDir = study["out"]
    copy = tmp_path / "two"
    shutil.copytree(od.path, copy)
    lines = (copy / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    clash = next(json.loads(x) for x in lines if json.loads(x)["subset"] != first["subset"])
    clash["query_id"] = first["query_id"]  # two subsets, one id
    (copy / "queries.jsonl").write_text("\n".join([lines[0], json.dumps(clash)]) + "\n", encoding="utf-8")
    r = run_cli("export", "trec", str(copy), "--to", str(tmp_path / "t"), "--bare-qids", cwd=tmp_path)
    assert r.returncode != 0 and "is in subsets" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_the_viewer_is_complete(study: dict) -> None:
    od: OutputDir = study["out"]
    html = (od.path / "view.html").read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S).group(1))
    records = od.read_records()
    assert len(data["records"]) == len(records) and len(data["queries"]) == len(study["qrels"])
    by_key = {(r.subset, str(r.query_id), r.run): r for r in records}
    k = data["datasets"][0]["k"]
    for v in data["records"]:
        q = data["queries"][v["q"]]
        rec = by_key[(q["subset"], str(q["id"]), v["run"])]
        assert set(v["archs"]) == {"rtp", "ptr", "hyde"}
        assert [data["apis"][i] for i in q["gold"][0]] == rec.gold_set("api_list")
        assert q.get("grades", [[1] * len(q["gold"][0])])[0] == [rec.grade(d) for d in rec.gold_set("api_list")]
        for arch in ("rtp", "ptr", "hyde"):
            want = rank_metrics(rec.block(arch).unique_retrieved, set(rec.gold_set("api_list")), k,  # type: ignore[union-attr]
                                rec.grades)
            for m in RANK_METRICS:
                assert v["rank"][arch][m][0] == pytest.approx(want[m], abs=1e-6)
    assert any("grades" in q for q in data["queries"])


def test_the_query_page_shows_the_grades_in_a_browser(study: dict, browser) -> None:
    page = study["out"].path / "view.html"
    open_page(browser, page)
    data = browser.execute_script("return JSON.parse(document.getElementById('data').textContent)")
    qi = next(i for i, q in enumerate(data["queries"]) if "grades" in q)
    ri = next(i for i, r in enumerate(data["records"]) if r["q"] == qi)
    go(browser, f"#q={qi}&r={ri}")
    text = browser.find_element("css selector", "body").text
    for grade in data["queries"][qi]["grades"][0]:
        assert f"grade {grade}" in text
    assert console_errors(browser) == []


def test_every_other_architecture_with_bm25_and_dense(study: dict) -> None:
    root = study["root"]
    out = root / "others"
    r = run_cli(*study["common"], "--model", "sim", "--archs", "rewrite,fusion,route", "--retriever", "bm25",
                "--runs", "1", "--no-extras", "--out", str(out), cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    records = OutputDir(out).read_records()
    assert {tuple(r.arch_names) for r in records} == {("rtp", "rewrite", "fusion", "route")}
    assert {r.retriever for r in records} == {"bm25"} and any(r.grades for r in records)
    assert "Table 1c" in (out / "report.md").read_text(encoding="utf-8")
    dry = root / "dry"
    r = run_cli(*study["common"], "--model", "sim", "--archs", "rtp,ptr,hyde", "--dry-run", "--out", str(dry), cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    plan = json.loads((dry / "plan.json").read_text(encoding="utf-8"))
    assert not (dry / "queries.jsonl").exists()
    assert set(plan["models"]["sim"]["by_arch"]) == {"rtp", "ptr", "hyde"} and plan["models"]["sim"]["calls"] > 0
    dense = root / "dense"
    r = run_cli(*study["common"], "--retrieval-only", "--no-extras", "--out", str(dense), cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    records = OutputDir(dense).read_records()
    assert {(r.model, r.retriever) for r in records} == {(None, None)} and len(records) == len(study["qrels"])
    assert "Graded relevance" in (dense / "report.md").read_text(encoding="utf-8")
