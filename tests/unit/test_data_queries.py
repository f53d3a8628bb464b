"""Your own query files (JSONL, CSV) and query ids: gold lists or `;` cells, subsets, normalised ids,
duplicates rejected, unknown gold ids counted, an empty query set refused."""

from __future__ import annotations

import json

import pytest

from evaluator.core.errors import DataError
from evaluator.data import (
    Api,
    Registry,
    Warnings,
    find_query_files,
    load_query_files,
    normalise_qid,
)

REG = Registry([Api("git", "git_status", None, "Shows the working tree status"),
                Api("git", "git_log", None, "Shows the commit logs"),
                Api("time", "get_current_time", None, "Get current time")], source="test")


def test_csv_with_semicolon_gold_equals_jsonl_with_lists(tmp_path):
    csv = tmp_path / "queries.csv"
    csv.write_text(
        "id,subset,query,gold\n"
        '1,single,"What changed in my repo?",git::git_status\n'
        '2,multi,"Show the log, and the time in Oslo",git::git_log; time::get_current_time\n',
        encoding="utf-8",
    )
    jl = tmp_path / "queries.jsonl"
    jl.write_text(
        json.dumps({"id": 1, "subset": "single", "query": "What changed in my repo?", "gold": ["git::git_status"]}) + "\n"
        + json.dumps({"id": 2, "subset": "multi", "query": "Show the log, and the time in Oslo",
                      "gold": ["git::git_log", "time::get_current_time"]}) + "\n",
        encoding="utf-8",
    )
    a, b = load_query_files([csv], REG), load_query_files([jl], REG)
    assert a == b
    assert a[1].gold == {"api_list": ("git::git_log", "time::get_current_time"),
                         "relevant": ("git::git_log", "time::get_current_time")}
    assert [(q.subset, q.query_id) for q in a] == [("single", 1), ("multi", 2)]


def test_excel_style_semicolon_csv_with_bom_and_optional_columns(tmp_path):
    p = tmp_path / "my_tests.csv"
    p.write_bytes("\ufeffQuery;Gold;Relevant\nWhat time is it?;time::get_current_time;\n".encode())
    [q] = load_query_files([p], REG)
    # No id: the record's position; no subset: the file's name.
    assert (q.subset, q.query_id, q.gold["relevant"]) == ("my_tests", 1, ("time::get_current_time",))


def test_optional_relevant_column_is_a_stricter_gold_set(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text(json.dumps({"query": "x", "gold": ["git::git_log", "git::git_status"], "relevant": "git::git_log"}) + "\n")
    [q] = load_query_files([p], REG)
    assert q.gold == {"api_list": ("git::git_log", "git::git_status"), "relevant": ("git::git_log",)}


def test_ids_of_any_json_type_are_normalised():
    assert normalise_qid(7, "w") == 7
    assert normalise_qid("7", "w") == 7 and normalise_qid(" 7 ", "w") == 7 and normalise_qid(7.0, "w") == 7
    assert normalise_qid("007", "w") == "007" and normalise_qid("q-7", "w") == "q-7" and normalise_qid(7.5, "w") == "7.5"
    assert normalise_qid(None, "w") is None and normalise_qid("", "w") is None
    for bad in (True, [7], {"id": 7}, float("nan")):
        with pytest.raises(DataError, match="^w: a query id must be"):
            normalise_qid(bad, "w")


def test_string_and_integer_seven_are_duplicates(tmp_path):
    p = tmp_path / "G1_instruction.json"
    rec = {"query": "q", "api_list": [{"tool_name": "git", "api_name": "git_log"}], "relevant APIs": [["git", "git_log"]]}
    p.write_text(json.dumps([{**rec, "query_id": "7"}, {**rec, "query_id": 7}]))
    with pytest.raises(DataError) as e:
        load_query_files([p], REG)
    msg = str(e.value)
    assert "G1_instruction.json record 1: query id 7 repeats" in msg and "record 0" in msg and "\n" not in msg


def test_duplicates_across_files_of_one_subset_and_defaulted_ids(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"id": 2, "subset": "s", "query": "x", "gold": "git::git_log"}) + "\n")
    b.write_text(json.dumps({"subset": "s", "query": "y", "gold": "git::git_log"}) + "\n"
                 + json.dumps({"subset": "s", "query": "z", "gold": "git::git_log"}) + "\n")
    with pytest.raises(DataError, match=r"b\.jsonl:2: query id 2 \(its position: the record has no id\) repeats .*a\.jsonl:1"):
        load_query_files([a, b], REG)


def test_string_ids_make_the_whole_subset_strings(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text("".join(json.dumps({"id": i, "query": "x", "gold": ["git::git_log"]}) + "\n" for i in (1, "q-2")))
    assert [q.query_id for q in load_query_files([p], REG)] == ["1", "q-2"]


def test_unknown_gold_ids_are_warnings_and_empty_gold_is_skipped(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text(json.dumps({"id": 1, "query": "x", "gold": ["git::git_log", "git::git_push"]}) + "\n"
                 + json.dumps({"id": 2, "query": "y", "gold": []}) + "\n")
    w = Warnings()
    [q] = load_query_files([p], REG, w)
    assert "git::git_push" in q.gold["api_list"]  # kept: a retriever that cannot find it misses it
    assert w.counts["gold_not_in_registry_api_list"] == 1 and "gold_not_in_registry_relevant" not in w.counts
    assert "q.jsonl:1 (query_id 1): git::git_push" in w.examples["gold_not_in_registry_api_list"][0]
    assert w.counts["empty_gold"] == 1


def test_subsets_and_limit(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text("".join(json.dumps({"id": i, "subset": s, "query": "x", "gold": "git::git_log"}) + "\n"
                         for i, s in enumerate(["single", "single", "single", "multi"])))
    assert [q.query_id for q in load_query_files([p], REG, limit=2)] == [0, 1, 3]
    assert [q.subset for q in load_query_files([p], REG, subsets=["mul"])] == ["multi"]
    with pytest.raises(DataError, match="Subset 'G1' matches no query subset; available: single, multi"):
        load_query_files([p], REG, subsets=["G1"])


def test_an_empty_query_set_is_refused(tmp_path):
    p = tmp_path / "queries.jsonl"
    p.write_text("\n")
    with pytest.raises(DataError, match=r"No query to run in .*queries\.jsonl: the files hold no query"):
        load_query_files([p], REG)
    p.write_text(json.dumps({"query": "x", "gold": ""}) + "\n")
    with pytest.raises(DataError, match="every query has an empty gold set"):
        load_query_files([p], REG)


def test_data_folder_finds_own_query_files_next_to_tools(tmp_path):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "git.json").write_text("{}")
    for name in ("queries.jsonl", "queries_extra.csv", "notes.json"):
        (tmp_path / name).write_text("")
    assert [p.name for p in find_query_files(tmp_path)] == ["queries.jsonl", "queries_extra.csv"]
    with pytest.raises(DataError, match="No query files under"):
        find_query_files(tmp_path / "tools")


def test_a_folder_of_query_files_and_plain_subset_names(tmp_path):
    d = tmp_path / "tests"
    d.mkdir()
    (d / "a.csv").write_text("query,gold\nx,git::git_log\n")
    (d / "b.jsonl").write_text(json.dumps({"query": "y", "gold": "git::git_status"}) + "\n")
    assert [(q.subset, q.query_id) for q in load_query_files([d], REG)] == [("a", 1), ("b", 1)]
    (d / "b.jsonl").write_text(json.dumps({"query": "y", "gold": "git::git_status", "subset": "../up"}) + "\n")
    with pytest.raises(DataError, match=r"b\.jsonl:1: subset '\.\./up' may not contain '/'"):
        load_query_files([d], REG)


def test_json_list_of_own_records(tmp_path):
    p = tmp_path / "mine.json"
    p.write_text(json.dumps([{"query": "x", "gold": ["git::git_log"], "relevant": []}, {"query": "y"}]))
    with pytest.raises(DataError, match=r"mine\.json record 1: missing 'gold'"):
        load_query_files([p], REG)
    p.write_text(json.dumps([{"query": "x", "gold": ["git::git_log"], "relevant": []}]))
    [q] = load_query_files([p], REG)
    assert q.gold["relevant"] == ("git::git_log",)  # an empty `relevant` falls back to `gold`
