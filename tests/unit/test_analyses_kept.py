"""Analyses computed once per change of their inputs (issue 42, the warm rerun): an unchanged rerun reads the main
study, scaling, routing and the view's records data back from `cache/analyses/` (app.memo), and what it writes is
what computing them again writes, byte for byte."""

from __future__ import annotations

import pytest

from evaluator.app import memo
from evaluator.app.memo import Memo


def _counting():
    calls: list[int] = []

    def compute() -> dict[str, int]:
        calls.append(1)
        return {"value": len(calls)}
    return calls, compute


def test_an_analysis_is_computed_once_per_change_of_its_inputs(tmp_path, monkeypatch):
    records, store = tmp_path / "queries.jsonl", tmp_path / "analyses"
    records.write_text('{"query": "a"}\n')
    calls, compute = _counting()
    kept = Memo(store, records)
    assert kept.kept("main_study", {"k": 5}, compute) == ({"value": 1}, False)
    assert kept.kept("main_study", {"k": 5}, compute) == ({"value": 1}, True)  # read back, not computed
    assert Memo(store, records).kept("main_study", {"k": 5}, compute) == ({"value": 1}, True)  # another run
    assert len(calls) == 1
    assert not kept.kept("main_study", {"k": 3}, compute)[1]  # other settings
    assert not kept.kept("routing", {"k": 5}, compute)[1]  # another analysis
    records.write_text('{"query": "b"}\n')
    assert not Memo(store, records).kept("main_study", {"k": 5}, compute)[1]  # other records
    monkeypatch.setattr(memo, "code_digest", lambda: "changed")
    assert not Memo(store, records).kept("main_study", {"k": 5}, compute)[1]  # other code
    assert Memo(None, records).kept("main_study", {"k": 5}, compute) == ({"value": 6}, False)  # no store: computed
    assert len(calls) == 6


def test_only_the_entries_written_last_are_kept(tmp_path, monkeypatch):
    records, store = tmp_path / "queries.jsonl", tmp_path / "analyses"
    records.write_text("{}\n")
    monkeypatch.setattr(memo, "_KEEP", 3)
    _, compute = _counting()
    for k in range(5):
        Memo(store, records).kept("routing", {"k": k}, compute)
    Memo(store, records).kept("scaling", {}, compute)
    assert len(list(store.glob("routing-*"))) == 3 and len(list(store.glob("scaling-*"))) == 1
    assert Memo(store, records).kept("routing", {"k": 4}, compute)[1]  # the last one written is there


@pytest.mark.parametrize("damage", [b"", b"not a pickle", None])
def test_a_damaged_entry_is_computed_again_and_rewritten(tmp_path, damage):
    records, store = tmp_path / "queries.jsonl", tmp_path / "analyses"
    records.write_text("{}\n")
    calls, compute = _counting()
    Memo(store, records).kept("scaling", {}, compute)
    (entry,) = store.iterdir()
    raw = entry.read_bytes()
    entry.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]) if damage is None else damage)  # a flipped bit, or cut
    assert Memo(store, records).kept("scaling", {}, compute) == ({"value": 2}, False)
    assert entry.read_bytes() != raw and Memo(store, records).kept("scaling", {}, compute) == ({"value": 2}, True)
