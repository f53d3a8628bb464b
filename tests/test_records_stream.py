"""Memory bounded as queries grow (issue 31, item 9): past `results.stream.held()` records a study spills its
records to disk as they finish and every analysis reads queries.jsonl as a stream, one record at a time; the
runner keeps a bounded window of queries in flight. What a user sees must not change: a streamed study or report
writes the same files as one that holds its records. Checked on a small limit (`EVALUATOR_RECORDS_HELD`, the
same rule as the shipped 20,000)."""

from __future__ import annotations

import asyncio
import json
import math
import random
import shutil

import pytest
import records_fixtures as RF
from study_fixtures import REPO, run_cli
from test_pipeline_protocols import FixedSearch, ScriptedClient, _study

from evaluator.analysis.stats import ExactSum
from evaluator.app import viewer as VW
from evaluator.results.schema import OutputDir, record_key
from evaluator.results.stream import HELD_ENV, RecordSpill, SavedRecords, records_of
from evaluator.study.runner import StudyRunner, Unit

EXAMPLE = REPO / "examples" / "mcp"


def _without_timing(d):
    if isinstance(d, dict):
        return {k: _without_timing(v) for k, v in d.items() if k != "timing_s"}
    if isinstance(d, list):
        return [_without_timing(v) for v in d]
    return d


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two copies of one synthetic run of two models x 3 runs, written out of key order (as by hand)."""
    root = tmp_path_factory.mktemp("stream")
    recs = RF.study(models=("sim", "sim2"), runs=3)
    meta = RF.meta(models=("sim", "sim2"), runs=3)
    for side in ("held", "streamed"):
        RF.write_out(root / side / "out", recs, meta, shuffle_seed=7)
    return root


def test_a_report_read_as_a_stream_writes_what_a_report_in_memory_writes(saved, monkeypatch):
    held, streamed = saved / "held" / "out", saved / "streamed" / "out"
    r = run_cli("report", str(held), cwd=saved)
    assert r.returncode == 0, r.stderr[-2000:]
    monkeypatch.setenv(HELD_ENV, "0")
    assert isinstance(records_of(OutputDir(streamed)), SavedRecords)
    r = run_cli("report", str(streamed), cwd=saved)
    assert r.returncode == 0, r.stderr[-2000:]
    for name in ("summary.json", "report.md", "view.html"):
        assert (held / name).read_bytes() == (streamed / name).read_bytes(), name


def test_a_paged_view_made_from_a_stream_is_the_view_made_in_memory(saved, monkeypatch):
    pages = {}
    for side, limit in (("held", "100000"), ("streamed", "0")):
        monkeypatch.setenv(HELD_ENV, limit)
        out = saved / side / "out"
        VW.write_page([OutputDir(out)], part_records=40)
        parts = sorted((out / "view-data").glob("part-*.js"))
        pages[side] = [(out / "view.html").read_text(encoding="utf-8")] + [p.read_text(encoding="utf-8") for p in parts]
    assert len(pages["held"]) > 3 and pages["held"] == pages["streamed"]


def test_the_stream_is_in_key_order_and_names_a_bad_line(saved, tmp_path, monkeypatch):
    out = tmp_path / "out"
    shutil.copytree(saved / "held" / "out", out)
    streamed = list(SavedRecords(OutputDir(out)))
    assert streamed == sorted(OutputDir(out).read_records(), key=record_key)
    lines = (out / "queries.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[2] = '{"archs": {"rtp": 5}\n'
    (out / "queries.jsonl").write_text("".join(lines), encoding="utf-8")
    monkeypatch.setenv(HELD_ENV, "0")
    r = run_cli("report", str(out), cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "queries.jsonl: line 3 is not a record" in r.stderr


def test_a_study_past_the_limit_spills_and_writes_the_same_results(tmp_path, monkeypatch):
    """Three architectures (the N-way comparison keeps per-query values), extras on: scaling and routing read the
    stream too. The second run answers from the cache the first filled, so only its cost differs."""
    common = ("--data", str(EXAMPLE), "--model", "sim", "--runs", "2", "--archs", "rtp,ptr,hyde",
              "--cache-dir", str(tmp_path / "cache"), "--no-progress")
    outs = {}
    for side, limit in (("streamed", "5"), ("held", "100000")):
        monkeypatch.setenv(HELD_ENV, limit)
        # each side computes its analyses (the same records would read the other side's back: app.memo)
        shutil.rmtree(tmp_path / "cache" / "analyses", ignore_errors=True)
        outs[side] = tmp_path / side / "out"
        r = run_cli(*common, "--out", str(outs[side]), cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        assert not (outs[side] / RecordSpill.SPILL).exists()
    a, b = outs["streamed"], outs["held"]
    assert len((a / "queries.jsonl").read_text(encoding="utf-8").splitlines()) > 5  # past the limit
    for name in ("queries.jsonl", "summary.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert json.loads((a / "summary.json").read_text(encoding="utf-8")).get("comparisons")  # three architectures
    for name in ("scaling.json", "routing.json"):
        assert _without_timing(json.loads((a / name).read_text())) == _without_timing(json.loads((b / name).read_text()))


class _Counting(ScriptedClient):
    """Counts the calls in flight at once (each takes a little while)."""

    def __init__(self, study) -> None:
        super().__init__(study)
        self.now = self.most = 0

    async def chat(self, messages, **kw):
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(0.005)
            return await super().chat(messages, **kw)
        finally:
            self.now -= 1


@pytest.mark.parametrize("window", [2, 1000])
def test_the_runner_keeps_a_bounded_window_of_queries_in_flight(tmp_path, window):
    study = _study(tmp_path)
    client = _Counting(study)
    runner = StudyRunner(study, {"scripted": client}, batcher=FixedSearch())
    units = [Unit("scripted", r) for r in range(6)]
    records = asyncio.run(runner.run(units, window=window))
    assert len(records) == 6 * len(study.queries)  # every query of every unit, once
    assert sorted((r.run, r.query_id) for r in records) == sorted((u.run, i + 1) for u in units
                                                                  for i in range(len(study.queries)))
    # a query holds at most two calls at once (RtP's planner beside PtR's discovery)
    if window == 2:
        assert client.most <= 4
    else:
        assert client.most > 8  # without the window every query starts at once


def test_the_exact_sum_is_fsum_whatever_the_count_and_order():
    rng = random.Random(3)
    values = [rng.choice([1 / 3, 2 / 3, 0.1, 1e-300, 1e300, -1e300, 5e-324]) * rng.choice([1, -1]) + rng.random()
              for _ in range(5_000)]
    values += [1 / 7] * 3_000
    for _ in range(3):
        rng.shuffle(values)
        s = ExactSum()
        for v in values:
            s.append(v)
        assert s.folded and s.value() == math.fsum(values)
    small = ExactSum()
    for v in values[:10]:
        small.append(v)
    assert not small.folded and small.value() == math.fsum(values[:10])
