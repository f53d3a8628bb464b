"""BEIR folders (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) as a registry and its queries, graded relevance
kept: read as BEIR's loader reads them, bad folders stopped in one line, graded NDCG equal to pytrec_eval's per
query (a whole study on a folder: tests/integration/test_beir.py)."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest
from helpers import REPO
from helpers.beir import DOCS, QUERIES, TEST_QRELS, beir_folder, tsv, write_qrels

from evaluator.analysis.metrics import rank_metrics
from evaluator.cli import main as cli
from evaluator.core.errors import DataError
from evaluator.data import CORPUS_TEXT_RULE, Warnings, load_query_files, load_registry
from evaluator.data.model import corpus_text
from evaluator.study import prompts
from evaluator.study.parse import parse_plan
from simulator.behaviour import _split_api_line, answer

pytrec_eval = pytest.importorskip("pytrec_eval")

EXAMPLE = REPO / "examples" / "beir"


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
    "qrels of another corpus": (lambda f: write_qrels(f, [("q1", "d9", 1), ("q2", "d3", 1), ("q3", "x", 1)]),
                                r"test\.tsv:2: 2 of 3 relevant judgements name no document of the registry "
                                r"\(.*corpus\.jsonl\), e\.g\. corpus-id 'd9'; .* --data DIR"),
    "qrels of other queries": (lambda f: write_qrels(f, [("q7", "d1", 1), ("q8", "d1", 1), ("q1", "d1", 1)]),
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
    write_qrels(folder, [("q4", "d4", 0)])
    with pytest.raises(DataError, match=r"no query has a judgement of score > 0 in the split .*check --split"):
        load(folder)


def test_a_bad_folder_stops_the_cli_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = beir_folder(tmp_path / "b")
    write_qrels(folder, [("q1", "d1", 2), ("q2", "nope", 1), ("q3", "nada", 1)])
    out = tmp_path / "out"
    # the sim profile at an endpoint nobody listens on: nothing is started (or sent) before the data is read
    rc = cli.main(["--data", str(folder), "--model", "sim", "--base-url", "http://127.0.0.1:9/v1", "--out", str(out),
                   "--cache-dir", str(tmp_path / "cache"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [
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
