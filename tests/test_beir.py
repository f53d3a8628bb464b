"""BEIR folders (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) as a registry and its queries, graded relevance
kept: read as BEIR's loader reads them, bad folders stopped in one line, graded NDCG equal to pytrec_eval's per
query, and a whole study (three architectures, the hybrid retriever, the TREC export, the viewer) on a folder."""

from __future__ import annotations

import gzip
import json
import math
import random
import re
import shutil
import urllib.parse
from collections import defaultdict
from pathlib import Path

import pytest
from test_app_run import run_cli  # the CLI in a child process, as a user runs it
from test_view import CHROMIUM, DRIVER, console_errors, go, open_page

from evaluator.analysis import stats as S
from evaluator.analysis.metric_defs import RANK_METRICS
from evaluator.analysis.metrics import rank_metrics, record_obs
from evaluator.core.errors import DataError
from evaluator.data import CORPUS_TEXT_RULE, Warnings, load_query_files, load_registry
from evaluator.data.model import corpus_text
from evaluator.results.schema import OutputDir, Record
from evaluator.study import prompts
from evaluator.study.parse import parse_plan
from simulator.behaviour import _split_api_line, answer

pytrec_eval = pytest.importorskip("pytrec_eval")

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "beir"

DOCS = [
    {"_id": "d1", "title": "weather_forecast", "text": "Daily weather forecast for a city."},
    {"_id": "d2", "title": "weather_history", "text": " Past weather observations of a city. "},
    {"_id": "d3", "title": "", "text": "Convert an amount between two currencies."},
    {"_id": "d4", "text": "Latest price of a stock ticker."},  # no title: BEIR embeds the text alone
    {"_id": "d5", "title": "send_email", "text": "Send an email to a recipient."},
    {"_id": 6, "title": "calendar_add", "text": "Add an event to a calendar."},  # an integer id reads as "6"
]
QUERIES = [
    {"_id": "q1", "text": "Will it rain in Paris tomorrow?", "metadata": {"subset": "weather"}},
    {"_id": "q2", "text": "How many euros is 100 dollars?", "metadata": {"subset": "money"}},
    {"_id": "q3", "text": "Email my boss and add the meeting to my calendar.", "metadata": {"subset": "office"}},
    {"_id": "q4", "text": "What is the Apple stock price?", "metadata": {"subset": "money"}},  # only score 0
    {"_id": "q5", "text": "Was last winter cold in Oslo?", "metadata": {"subset": "weather"}},  # judged in dev only
]
TEST_QRELS = [("q1", "d1", 2), ("q1", "d2", 1), ("q2", "d3", 1), ("q2", "d4", 0), ("q3", "d5", 3), ("q3", "6", 1),
              ("q3", "6", 1), ("q4", "d4", 0)]  # q3/6 twice (the same score): counted once
DEV_QRELS = [("q5", "d2", 1)]


def jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def tsv(rows: list[tuple[str, str, int]]) -> str:
    return "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in rows)


def beir_folder(root: Path, *, docs: list[dict] = DOCS, queries: list[dict] = QUERIES,
                test: str | None = None, gz: bool = False) -> Path:
    """A small BEIR folder; `gz`: corpus and qrels gzipped."""
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    files = {"corpus.jsonl": jsonl(docs), "queries.jsonl": jsonl(queries),
             "qrels/test.tsv": tsv(TEST_QRELS) if test is None else test, "qrels/dev.tsv": tsv(DEV_QRELS)}
    for name, text in files.items():
        if gz and name != "queries.jsonl":
            (root / f"{name}.gz").write_bytes(gzip.compress(text.encode()))
        else:
            (root / name).write_text(text, encoding="utf-8")
    return root


def load(folder: Path, **kw) -> tuple[list, Warnings, object]:
    w = Warnings()
    reg = load_registry(folder, warnings=w)
    return load_query_files([folder], reg, w, **kw), w, reg


# ---------------------------------------------------------------- reading


@pytest.mark.parametrize("gz", [False, True])
def test_a_beir_folder_is_a_registry_and_its_judged_queries(tmp_path: Path, gz: bool) -> None:
    folder = beir_folder(tmp_path / "toolset", gz=gz)
    queries, w, reg = load(folder)
    assert reg.format == "beir" and reg.ids == ["d1", "d2", "d3", "d4", "d5", "6"]
    # BEIR's SentenceBERT.encode_corpus: (title + " " + text).strip(); the planner sees the id and that text
    assert reg.texts() == ["weather_forecast Daily weather forecast for a city.",
                           "weather_history  Past weather observations of a city.",
                           "Convert an amount between two currencies.", "Latest price of a stock ticker.",
                           "send_email Send an email to a recipient.", "calendar_add Add an event to a calendar."]
    assert reg.texts() == [corpus_text(d.get("title") or "", d["text"]) for d in DOCS] and "strip()" in CORPUS_TEXT_RULE
    assert [a.display for a in reg.apis] == reg.ids
    assert reg.lookup_display()["send_email"] == "d5"  # a unique title names its document too
    # the judged queries of the test split, in the file's order; grades kept, score 0 out of the gold set
    assert [(q.subset, q.query_id) for q in queries] == [("toolset", "q1"), ("toolset", "q2"), ("toolset", "q3")]
    q1, q2, q3 = queries
    assert q1.gold["api_list"] == ("d1", "d2") and q1.grades == {"d1": 2, "d2": 1}
    assert q2.gold == {"api_list": ("d3",), "relevant": ("d3",)} and q2.grades == {}  # every grade 1: binary
    assert q3.grades == {"d5": 3, "6": 1} and q3.gold["relevant"] == ("d5", "6")
    assert w.counts["unjudged_query"] == 1 and "q5" in w.examples["unjudged_query"][0]
    assert w.counts["no_relevant_judgement"] == 1 and "q4" in w.examples["no_relevant_judgement"][0]
    assert w.counts["repeated_judgement"] == 1


def test_split_subset_field_and_the_parts_given_apart(tmp_path: Path) -> None:
    folder = beir_folder(tmp_path / "b")
    queries, _, reg = load(folder, subset_field="metadata.subset")
    assert [(q.subset, q.query_id) for q in queries] == [("weather", "q1"), ("money", "q2"), ("office", "q3")]
    dev, w, _ = load(folder, split="dev")
    assert [(q.query_id, q.gold["api_list"]) for q in dev] == [("q5", ("d2",))] and w.counts["unjudged_query"] == 4
    # --tools DIR with --queries DIR/queries.jsonl: the qrels are the folder's, beside the file
    again = load_query_files([folder / "queries.jsonl"], reg, Warnings())
    assert again == load_query_files([folder], reg, Warnings())
    assert load_registry(folder / "corpus.jsonl").ids == reg.ids  # the corpus file alone, detected from content


def test_the_example_folder_reads_as_documented() -> None:
    queries, w, reg = load(EXAMPLE, subset_field="metadata.subset")
    assert len(reg) == 38 and reg.format == "beir" and len(queries) == 28
    assert {q.subset for q in queries} == {"single", "multi"} and sum(bool(q.grades) for q in queries) == 3
    assert w.counts == {"unjudged_query": 4}
    dev, _, _ = load(EXAMPLE, split="dev")
    assert [q.query_id for q in dev] == ["q29", "q30", "q31", "q32"] and {q.subset for q in dev} == {"beir"}


def test_the_simulated_planner_names_documents_by_id() -> None:
    # a document's line: the id ends at the first ": ", whatever slashes and colons its text holds
    assert _split_api_line("fs.read: Read a file/dir. Note: text only") == ("fs.read", "Read a file/dir. Note: text only")
    # a tool name holding ": " (113 ToolBench APIs) still ends at the first ": " after the slash
    assert _split_api_line("Foo: Bar/get item: Gets an item") == ("Foo: Bar/get item", "Gets an item")
    reg = load_registry(EXAMPLE)
    offered = [a for a in reg.apis if a.id.startswith("time.")] + [reg.apis[0]]
    msgs = prompts.planner_messages("Convert 9am Sydney time to Paris time.", [(a.display, a.description) for a in offered])
    assert "- time.convert_time: convert_time Convert time between timezones" in msgs[1]["content"]
    picked = set()
    for seed in range(6):
        plan = parse_plan(answer(msgs, seed=seed, temperature=0.0), [(a.id, a.display) for a in offered])
        picked |= set(plan.selected_offered or [])
    assert "time.convert_time" in picked


BAD = {
    "no corpus": (lambda f: (f / "corpus.jsonl").unlink(), r"corpus\.jsonl: missing; a BEIR folder holds"),
    "no queries": (lambda f: (f / "queries.jsonl").unlink(), r"queries\.jsonl: missing"),
    "no split": (lambda f: (f / "qrels" / "test.tsv").unlink(), r"test\.tsv: missing; .*split\(s\) dev: pass --split"),
    "qrels of another corpus": (lambda f: _qrels(f, [("q1", "d9", 1), ("q2", "d3", 1), ("q3", "x", 1)]),
                                r"test\.tsv:2: 2 of 3 relevant judgements name no document of the registry "
                                r"\(.*corpus\.jsonl\), e\.g\. corpus-id 'd9'; .* --data DIR"),
    "qrels of other queries": (lambda f: _qrels(f, [("q7", "d1", 1), ("q8", "d1", 1), ("q1", "d1", 1)]),
                               r"test\.tsv:2: 2 of the 3 query-ids test\.tsv judges are not in .*queries\.jsonl"),
    "duplicate document id": (lambda f: _append(f / "corpus.jsonl", {"_id": "d2", "text": "again"}),
                              r"corpus\.jsonl:7: document id 'd2' repeats .*corpus\.jsonl:2 with another title or text"),
    "duplicate query id": (lambda f: _append(f / "queries.jsonl", {"_id": "q1", "text": "again"}),
                           r"queries\.jsonl:6: query id 'q1' repeats .*queries\.jsonl:1 with another text"),
    "malformed corpus line": (lambda f: _raw(f / "corpus.jsonl", '{"_id": "d7", "text": \n'),
                              r"corpus\.jsonl:7: malformed JSON"),
    "document without text": (lambda f: _append(f / "corpus.jsonl", {"_id": "d7", "title": "t"}),
                              r"corpus\.jsonl:7: missing the string field 'text'"),
    "two cells": (lambda f: _raw(f / "qrels" / "test.tsv", "q1\td1\n"), r"test\.tsv:10: expected 3 tab-separated"),
    "spaces for tabs": (lambda f: _raw(f / "qrels" / "test.tsv", "q1 d1 1\n"), r"test\.tsv:10: .*Separate the columns"),
    "score not a grade": (lambda f: _raw(f / "qrels" / "test.tsv", "q1\td1\thigh\n"), r"test\.tsv:10: score 'high'"),
    "two scores for a pair": (lambda f: _raw(f / "qrels" / "test.tsv", "q1\td1\t1\n"),
                              r"test\.tsv:10: \('q1', 'd1'\) is judged 1 here and 2 at .*test\.tsv:2"),
}


def _qrels(folder: Path, rows: list[tuple[str, str, int]]) -> None:
    (folder / "qrels" / "test.tsv").write_text(tsv(rows), encoding="utf-8")


def _append(path: Path, rec: dict) -> None:
    _raw(path, json.dumps(rec) + "\n")


def _raw(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(text)


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_folder_is_one_line_naming_file_and_line(tmp_path: Path, case: str) -> None:
    folder = beir_folder(tmp_path / "b")
    spoil, message = BAD[case]
    spoil(folder)
    with pytest.raises(DataError) as e:
        load(folder)
    assert "\n" not in str(e.value) and re.search(message, str(e.value)), str(e.value)


def test_a_few_dangling_judgements_and_repeated_lines_are_counted(tmp_path: Path) -> None:
    """BEIR's ArguAna judges documents its corpus lacks, NFCorpus queries its queries.jsonl lacks: counted, the
    missing document kept in the gold set (unreachable, as pytrec_eval scores it on the folder's qrels). A line
    repeated as it is is read once."""
    folder = beir_folder(tmp_path / "b", test=tsv([*TEST_QRELS, ("q1", "d9", 1), ("q9", "d1", 2)]),
                         docs=[*DOCS, DOCS[0]], queries=[*QUERIES, QUERIES[1]])  # a line repeated: read once
    queries, w, reg = load(folder)
    assert len(reg) == len(DOCS) and len(queries) == 3
    assert w.counts["repeated_document"] == 1 and w.counts["repeated_query"] == 1
    assert queries[0].gold["api_list"] == ("d1", "d2", "d9") and queries[0].grades == {"d1": 2, "d2": 1, "d9": 1}
    assert w.counts["judged_not_in_corpus"] == 1 and "test.tsv:10: corpus-id 'd9'" in w.examples["judged_not_in_corpus"][0]
    assert w.counts["judged_query_missing"] == 1 and "test.tsv:11: query-id 'q9'" in w.examples["judged_query_missing"][0]


def test_a_missing_subset_field_and_no_judged_query_are_one_line(tmp_path: Path) -> None:
    folder = beir_folder(tmp_path / "b")
    with pytest.raises(DataError, match=r"queries\.jsonl:1: the subset field 'meta\.group' is absent"):
        load(folder, subset_field="meta.group")
    _qrels(folder, [("q4", "d4", 0)])
    with pytest.raises(DataError, match=r"no query has a judgement of score > 0 in the split .*check --split"):
        load(folder)


def test_a_bad_folder_stops_the_cli_before_any_work(tmp_path: Path) -> None:
    folder = beir_folder(tmp_path / "b")
    _qrels(folder, [("q1", "d1", 2), ("q2", "nope", 1), ("q3", "nada", 1)])
    out = tmp_path / "out"
    r = run_cli("--data", str(folder), "--model", "sim", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
                "--no-progress", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: {folder}/qrels/test.tsv:3: 2 of 3 relevant judgements name no document of the registry "
        f"({folder}/corpus.jsonl), e.g. corpus-id 'nope'; the qrels and the corpus must be of one folder: pass the "
        "BEIR folder itself with --data DIR (or --tools DIR), or fix the ids."]
    assert not (out / "queries.jsonl").exists()


# ---------------------------------------------------------------- graded NDCG


def test_graded_ndcg_equals_pytrec_eval_and_binary_gold_is_unchanged() -> None:
    rng = random.Random(7)
    docs = [f"d{i}" for i in range(30)]
    checked = 0
    for _ in range(200):
        judged = {d: rng.choice([0, 1, 1, 2, 3]) for d in rng.sample(docs, rng.randint(1, 8))}
        grades = {d: g for d, g in judged.items() if g > 0}
        if not grades:
            continue
        ranked = rng.sample(docs, rng.randint(0, 25))
        run = {"q": {d: float(len(ranked) - i) for i, d in enumerate(ranked)} or {"none": 0.0}}
        for k in (1, 3, 5, 10, 20):
            # the judgements of score 0 go to pytrec_eval as they are: judged non-relevant, no gain
            theirs = pytrec_eval.RelevanceEvaluator({"q": judged}, {f"ndcg_cut.{k}"}).evaluate(run)["q"][f"ndcg_cut_{k}"]
            assert rank_metrics(ranked, set(grades), k, grades)["ndcg"] == pytest.approx(theirs, abs=1e-12)
            # grades of 1 are binary gold, float for float
            assert rank_metrics(ranked, set(grades), k, dict.fromkeys(grades, 1)) == rank_metrics(ranked, set(grades), k)
            checked += 1
    assert checked > 500
    m = rank_metrics(["b", "x", "a"], {"a", "b"}, 3, {"a": 3, "b": 1})
    assert m["ndcg"] == pytest.approx((1 + 3 / 2) / (3 + 1 / math.log2(3)))


# ---------------------------------------------------------------- a study on a BEIR folder


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
    _qrels(folder, rows)
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


def test_the_query_page_shows_the_grades_in_a_browser(study: dict) -> None:
    if not (CHROMIUM and DRIVER):
        pytest.skip("chromium and chromedriver are not installed (.ci/setup installs them)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the dev extra")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=DRIVER))
    try:
        page = study["out"].path / "view.html"
        open_page(driver, page)
        data = driver.execute_script("return JSON.parse(document.getElementById('data').textContent)")
        qi = next(i for i, q in enumerate(data["queries"]) if "grades" in q)
        ri = next(i for i, r in enumerate(data["records"]) if r["q"] == qi)
        go(driver, f"#q={qi}&r={ri}")
        text = driver.find_element("css selector", "body").text
        for grade in data["queries"][qi]["grades"][0]:
            assert f"grade {grade}" in text
        assert console_errors(driver) == []
    finally:
        driver.quit()


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
