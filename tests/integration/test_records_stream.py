"""A study past the records' limit (issue 31, item 9), as the CLI runs it: it spills its records to disk as they
finish, every analysis (scaling and routing too) reads queries.jsonl as a stream, and it writes what a study that
holds its records writes. Checked on a small limit (`EVALUATOR_RECORDS_HELD`)."""

from __future__ import annotations

import json
import shutil

from helpers import EXAMPLE
from helpers.cli import run_cli

from evaluator.results.stream import HELD_ENV, RecordSpill


def _without_timing(d):
    if isinstance(d, dict):
        return {k: _without_timing(v) for k, v in d.items() if k != "timing_s"}
    if isinstance(d, list):
        return [_without_timing(v) for v in d]
    return d


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
