"""Memory bounded as queries grow (issue 31, item 9): past `results.stream.held()` records every analysis reads
queries.jsonl as a stream, one record at a time; the runner keeps a bounded window of queries in flight. What a
user sees must not change: a streamed report writes the same files as one that holds its records (a whole study
past the limit: tests/integration/test_records_stream.py). Checked on a small limit (`EVALUATOR_RECORDS_HELD`,
the same rule as the shipped 20,000)."""

from __future__ import annotations

import asyncio
import math
import random
import shutil

import pytest
from helpers import records as RF
from helpers.clock import run_virtual
from helpers.fakes import FixedSearch, ScriptedClient, scripted_study

from evaluator.analysis.stats import ExactSum
from evaluator.app import viewer as VW
from evaluator.cli import main as cli
from evaluator.results.schema import OutputDir, record_key
from evaluator.results.stream import HELD_ENV, SavedRecords, records_of
from evaluator.study.runner import StudyRunner, Unit


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two copies of one synthetic run of two models x 3 runs, written out of key order (as by hand)."""
    root = tmp_path_factory.mktemp("stream")
    recs = RF.study(models=("sim", "sim2"), runs=3)
    meta = RF.meta(models=("sim", "sim2"), runs=3)
    for side in ("held", "streamed"):
        RF.write_out(root / side / "out", recs, meta, shuffle_seed=7)
    return root


def test_a_report_read_as_a_stream_writes_what_a_report_in_memory_writes(saved, monkeypatch, capsys):
    held, streamed = saved / "held" / "out", saved / "streamed" / "out"
    assert cli.main(["report", str(held)]) == 0, capsys.readouterr().err[-2000:]
    monkeypatch.setenv(HELD_ENV, "0")
    assert isinstance(records_of(OutputDir(streamed)), SavedRecords)
    assert cli.main(["report", str(streamed)]) == 0, capsys.readouterr().err[-2000:]
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


def test_the_stream_is_in_key_order_and_names_a_bad_line(saved, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    shutil.copytree(saved / "held" / "out", out)
    streamed = list(SavedRecords(OutputDir(out)))
    assert streamed == sorted(OutputDir(out).read_records(), key=record_key)
    lines = (out / "queries.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[2] = '{"archs": {"rtp": 5}\n'
    (out / "queries.jsonl").write_text("".join(lines), encoding="utf-8")
    monkeypatch.setenv(HELD_ENV, "0")
    rc = cli.main(["report", str(out)])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err
    assert "queries.jsonl: line 3 is not a record" in err


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
    study = scripted_study(tmp_path)
    client = _Counting(study)
    runner = StudyRunner(study, {"scripted": client}, batcher=FixedSearch())
    units = [Unit("scripted", r) for r in range(6)]
    records = run_virtual(lambda _loop: runner.run(units, window=window))  # each call's little while is virtual
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
