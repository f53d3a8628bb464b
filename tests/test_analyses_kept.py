"""Analyses computed once per change of their inputs (issue 42, the warm rerun): an unchanged rerun reads the main
study, scaling, routing and the view's records data back from `cache/analyses/` (app.memo), and what it writes is
what computing them again writes, byte for byte."""

from __future__ import annotations

import json
import shutil

import pytest
from study_fixtures import REPO, run_cli

from evaluator.app import memo
from evaluator.app.memo import Memo

EXAMPLE = REPO / "examples" / "mcp"


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


def _without_timing(path):
    value = json.loads(path.read_text())
    value["meta"].pop("timing_s")
    return value


def test_an_unchanged_rerun_reads_its_analyses_back_and_writes_what_computing_them_writes(tmp_path):
    common = ("--data", str(EXAMPLE), "--model", "sim", "--runs", "2", "--archs", "rtp,ptr,hyde",
              "--cache-dir", str(tmp_path / "cache"), "--no-progress")
    first, second = tmp_path / "a" / "out", tmp_path / "b" / "out"
    for out in (first, second):
        r = run_cli(*common, "--out", str(out), cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
    kept = sorted(p.name.split("-")[0] for p in (tmp_path / "cache" / "analyses").iterdir())
    assert kept == ["main_study", "routing", "scaling", "view"]  # stored by the first run, read by the second
    assert (first / "summary.json").read_bytes() == (second / "summary.json").read_bytes()
    assert (first / "queries.jsonl").read_bytes() == (second / "queries.jsonl").read_bytes()
    for name in ("scaling.json", "routing.json"):
        assert _without_timing(first / name) == _without_timing(second / name)
    # the second run's files, from what was kept, against the same files computed from its saved data
    written = {name: (second / name).read_bytes() for name in ("summary.json", "report.md", "view.html")}
    shutil.rmtree(tmp_path / "cache" / "analyses")  # nothing kept to read, whatever `report` does
    r = run_cli("report", str(second), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    for name, data in written.items():
        assert (second / name).read_bytes() == data, name
