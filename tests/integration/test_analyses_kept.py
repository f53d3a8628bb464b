"""An unchanged rerun of the CLI reads the main study, scaling, routing and the view's records data back from
`cache/analyses/` (app.memo), and what it writes is what computing them again writes, byte for byte (issue 42)."""

from __future__ import annotations

import json
import shutil

from helpers import EXAMPLE
from helpers.cli import run_cli


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
