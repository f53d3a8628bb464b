"""One rate per API key across processes: two processes booking on one folder's row get one schedule, exactly as one
process booking all of it (each on a frozen clock: the schedule is computed, nothing is timed), and two `requests
run` on one cache folder pace on one row. How close two such runs stay to a server's enforced RPM under load is a
measurement: bench/shared_rate.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from helpers.cli import run_cli
from helpers.procs import PYTHON, communicate, start

from evaluator.core.cache_layout import CacheLayout
from evaluator.llm import load_profile
from evaluator.llm.limiters import rate_key

T = 1_700_000_000.0  # the wall-clock instant every reservation is made at


BOOK = """
import json, sys, time
time.time = lambda: {t!r}  # frozen: the schedule is computed, nothing is timed
from evaluator.llm.limiters import SharedPacer
pacer = SharedPacer(sys.argv[1], "k", 600.0)
print(json.dumps([round(pacer.reserve() - {t!r}, 9) for _ in range(int(sys.argv[2]))]))
"""


def _booked_by(processes: int, folder: Path, n: int) -> list[float]:
    """`n` reservations on one row from each of `processes` processes started together: the slots, sorted."""
    procs = [start([PYTHON, "-c", BOOK.format(t=T), str(folder), str(n)]) for _ in range(processes)]
    outs = [communicate(p, 300) for p in procs]
    assert [p.returncode for p in procs] == [0] * processes, [err for _, err in outs]
    return sorted(s for out, _ in outs for s in json.loads(out))


def test_two_processes_on_one_row_book_the_schedule_of_one(tmp_path):
    # however their reservations interleave, each is one atomic UPSERT on the shared row
    assert _booked_by(2, tmp_path / "two", 40) == _booked_by(1, tmp_path / "one", 80)


def _rows(cache: Path) -> list[str]:
    with sqlite3.connect(CacheLayout(cache).rates / "rate.db") as db:
        return [k for (k,) in db.execute("SELECT key FROM gcra")]


def test_two_request_runs_on_one_cache_pace_on_one_row(sim, tmp_path):
    lines = [json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"messages": [{"role": "user", "content": f"Request {i}"}], "max_tokens": 8}})
             for i in range(20)]
    (tmp_path / "a.jsonl").write_text("\n".join(lines[:10]) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(lines[10:]) + "\n")
    for x, cache in (("a", "one"), ("b", "one"), ("a", "other")):
        r = run_cli("requests", "run", str(tmp_path / f"{x}.jsonl"), "--model", "sim", "--base-url", sim.base_url,
                    "--rpm", "6000", "--cache-dir", str(tmp_path / cache), "--out", str(tmp_path / f"{x}-{cache}.out"),
                    "--no-progress", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    assert sim.stats()["ok"] == 30
    key = rate_key(sim.base_url, load_profile("sim").model, None, "rpm")
    assert _rows(tmp_path / "one") == [key]  # both runs on one cache: one row, the key of (endpoint, model, key)
    assert _rows(tmp_path / "other") == [key]  # another cache folder: a schedule of its own
