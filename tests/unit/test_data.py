"""Loading the registry and queries: both layouts, both registry choices, and clear errors."""

from __future__ import annotations

import json

import pytest
from helpers.data import CATEGORIES, UNDESCRIBED, make_data_dir, make_toolenv_tree

from evaluator.core.errors import DataError
from evaluator.data import (
    Warnings,
    find_query_files,
    load_queries,
    load_registry,
    resolve_data_dir,
    select_subsets,
)

N_DESCRIBED = sum(len(v) for v in CATEGORIES.values())


@pytest.mark.parametrize("gz", [True, False])
def test_jsonl_registry_full_and_described(tmp_path, gz):
    d = make_data_dir(tmp_path, gz=gz)
    full = load_registry(d, "full")
    assert len(full) == N_DESCRIBED + len(UNDESCRIBED)
    # Undescribed APIs embed as "{tool}/{api}: " (STUDY.md).
    assert "Mystery Tool/do thing: " in full.texts()
    described = load_registry(d, "described")
    assert len(described) == N_DESCRIBED
    assert all(a.description for a in described.apis)


def test_toolbench_tree_matches_jsonl(tmp_path):
    tree = load_registry(make_toolenv_tree(tmp_path / "tb"), "full")
    jsonl = load_registry(make_data_dir(tmp_path / "j"), "described")
    assert sorted(tree.ids) == sorted(jsonl.ids)
    assert {a.id: a.category for a in tree.apis} == {a.id: a.category for a in jsonl.apis}
    assert {a.id: a.text for a in tree.apis} == {a.id: a.text for a in jsonl.apis}


def test_malformed_jsonl_names_file_and_line(tmp_path):
    p = tmp_path / "apis.jsonl"
    p.write_text('{"tool_name": "A", "api_name": "x"}\n{"tool_name": "B", "api_name": \n', encoding="utf-8")
    with pytest.raises(DataError, match=r"apis\.jsonl:2: malformed JSON"):
        load_registry(p)


def test_duplicate_apis_are_counted_not_silent(tmp_path):
    p = tmp_path / "apis.jsonl"
    rec = {"tool_name": "A", "api_name": "x", "category": None, "api_description": None}
    described = dict(rec, api_description="does x")
    p.write_text("\n".join(json.dumps(r) for r in (rec, described, rec)) + "\n", encoding="utf-8")
    w = Warnings()
    reg = load_registry(p, warnings=w)
    assert len(reg) == 1 and reg.apis[0].description == "does x"
    assert w.counts["duplicate_api"] == 2
    assert "apis.jsonl:2" in w.as_dict()["duplicate_api"]["examples"][0]


def test_queries_gold_sets_and_missing_gold_warning(tmp_path):
    d = make_data_dir(tmp_path)
    reg = load_registry(d, "described")
    w = Warnings()
    qs = [q for f in find_query_files(d) for q in load_queries(f, reg, w)]
    assert [q.subset for q in qs].count("G1_instruction") == 3
    q = next(q for q in qs if q.query_id == 10)
    assert q.gold["api_list"] == ("Hotels Finder::search hotels", "Airports Finder::airports by city", "Currency Exchange::convert")
    assert q.gold["relevant"] == ("Hotels Finder::search hotels", "Currency Exchange::convert")
    assert not w.counts
    # A gold API the registry lacks stays in the gold set (it cannot be retrieved) and is counted.
    path = d / "queries" / "G1_instruction.json"
    data = json.loads(path.read_text())
    data[0]["relevant APIs"].append(["Ghost", "api"])
    path.write_text(json.dumps(data))
    w = Warnings()
    q0 = load_queries(path, reg, w)[0]
    assert "Ghost::api" in q0.gold["relevant"]
    assert w.counts["gold_not_in_registry_relevant"] == 1


def test_bad_query_record_is_named(tmp_path):
    p = tmp_path / "G9_instruction.json"
    p.write_text(json.dumps([{"query_id": 1, "query": "x", "api_list": [{"tool_name": "A"}], "relevant APIs": []}]))
    with pytest.raises(DataError, match=r"G9_instruction\.json record 0"):
        load_queries(p)


def test_subset_prefixes_and_unknown_subset(tmp_path):
    files = find_query_files(make_data_dir(tmp_path))
    assert [f.stem for f in select_subsets(files, ["G2"])] == ["G2_instruction"]
    with pytest.raises(DataError, match="available: G1_instruction, G2_instruction"):
        select_subsets(files, ["G7"])


def test_data_dir_resolution_order(tmp_path, monkeypatch):
    a, b = make_data_dir(tmp_path / "a"), make_data_dir(tmp_path / "b")
    monkeypatch.setenv("EVALUATOR_DATA", str(b))
    assert resolve_data_dir(str(a), "nowhere", tmp_path) == a.resolve()
    assert resolve_data_dir(None, "nowhere", tmp_path) == b.resolve()
    monkeypatch.delenv("EVALUATOR_DATA")
    with pytest.raises(DataError) as e:
        resolve_data_dir(None, "nowhere", tmp_path)
    assert "--data DIR or EVALUATOR_DATA" in str(e.value) and "nowhere" in str(e.value)
