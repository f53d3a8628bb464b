"""An output folder has one writer (issue 38): two studies on one --out, a lock left by a killed study, another
study's results, `report` / `view` beside a writer.

Before the fix two studies into one --out both exited 0, both printed "Results in OUT", and the folder ended with
only the second study. Every process the tests start runs in its own process group, stopped by group (also on
failure: helpers/procs.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

from helpers.cli import CLI, one_line, run_cli
from helpers.procs import PYTHON, started, wait_until
from helpers.study import study_args, workspace

from evaluator.results.outlock import LOCK_FILE

HOLD = """
import sys, time
from pathlib import Path
from evaluator.results.outlock import writing
with writing(Path(sys.argv[1]), "a test holder"):
    print("held", flush=True)
    time.sleep(600)
"""


def wait_for_lock(out: Path, pid: int, proc: subprocess.Popen) -> None:
    def held() -> bool:
        with contextlib.suppress(OSError):
            return f"pid={pid}\n" in (out / LOCK_FILE).read_text()
        return False

    wait_until(held, proc, what="the study's lock")


def test_two_studies_on_one_out_and_a_lock_left_by_a_killed_one(tmp_path):
    with workspace(tmp_path) as ws:
        _, _, sim = ws
        out, cache = tmp_path / "out", tmp_path / "cache"
        args = study_args(ws, cache, out, "--limit", "2", runs=1)
        sim.configure(latency_s=600)  # the first study waits on its calls until it is killed
        with started([*CLI, *args], cwd=tmp_path) as first:
            wait_for_lock(out, first.pid, first)
            second = run_cli(*args, cwd=tmp_path)
            line = one_line(second.stderr)
            assert second.returncode == 2 and "is being written by" in line, second.stderr
            assert f"pid {first.pid} on " in line and "a study started" in line and f"kill {first.pid}" in line
            assert "Results in" not in second.stdout
            os.killpg(first.pid, signal.SIGKILL)  # no clean-up of its own: the lock file stays behind
            first.wait()
        assert f"pid={first.pid}" in (out / LOCK_FILE).read_text()
        sim.configure(latency_s=0)
        again = run_cli(*args, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert f"took over the lock left by pid {first.pid}" in again.stderr and "no longer running" in again.stderr
        assert not (out / LOCK_FILE).exists()
        # The same study again resumes into its folder: no option needed, nothing said about the folder.
        rerun = run_cli(*args, cwd=tmp_path)
        assert rerun.returncode == 0 and "lock" not in rerun.stderr and "another study" not in rerun.stderr, rerun.stderr


def test_another_studys_results_need_overwrite_and_are_replaced_not_merged(tmp_path):
    with workspace(tmp_path) as ws:
        out, cache = tmp_path / "out", tmp_path / "cache"
        first = run_cli(*study_args(ws, cache, out, "--limit", "2", "--archs", "rtp,ptr,hyde", runs=1), cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
        other = run_cli(*study_args(ws, cache, out, "--limit", "2", runs=2), cwd=tmp_path)
        line = one_line(other.stderr)
        assert other.returncode == 2 and "holds the results of another study" in line and "--overwrite" in line, line
        assert "run.archs" in line
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # nothing rewritten
        retrieval = run_cli("--retrieval-only", *study_args(ws, cache, out, runs=1), cwd=tmp_path)
        assert retrieval.returncode == 2 and "another study" in retrieval.stderr
        replaced = run_cli(*study_args(ws, cache, out, "--limit", "2", "--overwrite", runs=2), cwd=tmp_path)
        assert replaced.returncode == 0, replaced.stderr
        assert "--overwrite" in replaced.stderr and "replaced" in replaced.stderr
        meta = json.loads((out / "meta.json").read_text())
        assert meta["runs"] == 2 and meta["settings"]["run"]["archs"] == ["rtp", "ptr"]
        records = [json.loads(x) for x in (out / "queries.jsonl").read_text().splitlines()]
        assert {r["run"] for r in records} == {0, 1}
        assert all(set(r["archs"]) == {"rtp", "ptr"} for r in records)  # no hyde block of the first study left
        assert "hyde" not in (out / "report.md").read_text()


def test_report_and_view_wait_for_no_writer(tmp_path):
    with workspace(tmp_path) as ws:
        out = tmp_path / "out"
        done = run_cli(*study_args(ws, tmp_path / "cache", out, "--limit", "1", runs=1), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        with started([PYTHON, "-c", HOLD, str(out)], cwd=tmp_path) as holder:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            for cmd in (["report", str(out)], ["view", str(out)], ["routing", str(out)]):
                res = run_cli(*cmd, cwd=tmp_path)
                line = one_line(res.stderr)
                assert res.returncode == 2 and f"pid {holder.pid} on " in line and "a test holder" in line, res.stderr
        assert run_cli("report", str(out), cwd=tmp_path).returncode == 0  # the holder is gone: free again
