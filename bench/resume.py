"""Benchmark 4: SIGKILL the evaluator CLI at 5 random moments, rerun each time, count what was re-bought.

One simulator (lognormal latency, so kills land with requests in flight) serves every run via
`--base-url`. First an uninterrupted run with its own fresh LLM cache gives the calls the study needs
and the reference outputs. Then, with another fresh cache, the same command is started and killed
with SIGKILL when the simulator has answered a seeded random share of those calls, five times, and
finally run to the end. Embeddings are never recomputed: the temp caches link the embedding shards.

Per attempt: requests the simulator received minus replies the cache gained = requests whose reply
was lost. The claim: their sum is all the extra the resumed study cost (requests in flight at the
kills, nothing more), and the final `summary.json` equals the uninterrupted run's byte for byte.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson

from evaluator.llm import ResponseCache
from simulator.harness import SimHandle, start_simulator

from .common import BENCH_CACHE, PROJECT_CACHE, PYTHON, REPO, Goal, Result, link_embeddings, temp_dir

NAME = "resume"
MEASURES = ("evaluator", "simulator", "bench/resume.py")  # the code it measures (`python -m bench --check`)
TITLE = "4. Resume after SIGKILL: requests re-sent and identical results"
KILLS = 5
SEED = 11
LIMIT = 20  # queries per subset: 60 queries x 4 runs x 2 models x 3 calls
CONCURRENCY = 16  # per model; keeps the run ~20 s long so kills land mid-run
SIM = {"latency": "lognormal", "latency_s": 0.4, "latency_sigma": 0.5, "seed": 5}


def _cmd(base_url: str, cache: Path, out: Path) -> list[str]:
    return [PYTHON, "-m", "evaluator", "--model", "sim", "--model", "sim-b", "--runs", "4", "--limit", str(LIMIT),
            "--base-url", base_url, "--cache-dir", str(cache), "--out", str(out), "--no-progress",
            "--concurrency", str(CONCURRENCY)]


def _entries(cache: Path) -> int:
    if not (cache / "llm" / "cache.db").exists():
        return 0
    c = ResponseCache(cache)
    try:
        return len(c)
    finally:
        c.close()


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _run_to_end(cmd: list[str], log: Path) -> float:
    t0 = time.perf_counter()
    proc = _start(cmd, log)
    if proc.wait() != 0:
        raise RuntimeError(f"evaluator exited with {proc.returncode}; see {log}:\n{log.read_text()[-2000:]}")
    return time.perf_counter() - t0


def _kill_at(sim: SimHandle, cmd: list[str], log: Path, target_ok: int) -> dict[str, Any]:
    """Start the CLI; SIGKILL it once the simulator has answered `target_ok` distinct calls."""
    proc = _start(cmd, log)
    t0 = time.perf_counter()
    while proc.poll() is None:
        st = sim.stats()
        if st["distinct_ok"] >= target_ok:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"killed": True, "after_s": time.perf_counter() - t0, "in_flight_at_kill": st["in_flight"]}
        time.sleep(0.01)
    return {"killed": False, "after_s": time.perf_counter() - t0, "in_flight_at_kill": 0, "rc": proc.returncode}


def run() -> Result:
    rng = random.Random(SEED)
    with temp_dir("resume") as tmp, start_simulator(**SIM) as sim:
        # Both studies use the same --cache-dir and --out paths (the reference's are renamed after it
        # finished), so their settings, which summary.json records, are identical too.
        cache, out, log = tmp / "cache", tmp / "out", tmp / "evaluator.log"
        cmd = _cmd(sim.base_url, cache, out)
        link_embeddings(cache, (PROJECT_CACHE, BENCH_CACHE))
        sim.reset_stats()
        ref_wall = _run_to_end(cmd, log)
        needed = sim.stats()["requests"]
        needed_entries = _entries(cache)
        ref_out = out.rename(tmp / "out-ref")
        cache.rename(tmp / "cache-ref")
        res_cache, res_out = cache, out
        link_embeddings(cache, (PROJECT_CACHE, BENCH_CACHE))

        sim.configure()  # same latency draws for the resumed sequence
        sim.reset_stats()
        shares = sorted(rng.uniform(0.05, 0.95) for _ in range(KILLS))
        attempts = []
        for share in shares:
            req0, ent0 = sim.stats()["requests"], _entries(res_cache)
            a = _kill_at(sim, cmd, log, int(share * needed))
            time.sleep(0.3)  # let the simulator notice the dropped connections
            a |= {"share": round(share, 3), "sent": sim.stats()["requests"] - req0, "stored": _entries(res_cache) - ent0}
            a["lost"] = a["sent"] - a["stored"]
            attempts.append(a)
        req0, ent0 = sim.stats()["requests"], _entries(res_cache)
        final_wall = _run_to_end(cmd, log)
        final = {"sent": sim.stats()["requests"] - req0, "stored": _entries(res_cache) - ent0}
        server = sim.stats()

        same_summary = (ref_out / "summary.json").read_bytes() == (res_out / "summary.json").read_bytes()
        ref_rows = orjson.loads((ref_out / "summary.json").read_bytes())["rows"]
        res_rows = orjson.loads((res_out / "summary.json").read_bytes())["rows"]
        same_records = (ref_out / "queries.jsonl").read_bytes() == (res_out / "queries.jsonl").read_bytes()

    total = server["requests"]
    extra = total - needed
    lost = sum(a["lost"] for a in attempts) + final["sent"] - final["stored"]
    in_flight = sum(a["in_flight_at_kill"] for a in attempts)
    rows = [[f"kill {i + 1} at {a['share']:.0%} of the calls", round(a["after_s"], 1), a["sent"], a["stored"], a["lost"],
             a["in_flight_at_kill"], a["killed"]] for i, a in enumerate(attempts)]
    rows.append(["final rerun to the end", round(final_wall, 1), final["sent"], final["stored"],
                 final["sent"] - final["stored"], 0, False])
    ok_extra = extra == lost and all(a["lost"] <= 2 * CONCURRENCY for a in attempts)
    identical = same_summary and ref_rows == res_rows
    return Result(
        name=NAME, title=TITLE,
        columns=["attempt", "ran s", "requests sent", "replies cached", "lost (re-sent later)", "in flight at kill (snapshot)",
                 "killed mid-run"],
        rows=rows,
        extra_tables=[{"title": "totals", "columns": ["what", "value"], "rows": [
            ["calls the study needs (uninterrupted run's requests)", needed],
            ["requests the simulator received over kills + reruns", total],
            ["extra requests", extra],
            ["sum of replies lost to the kills", lost],
            ["sum of in-flight snapshots at the kills", in_flight],
            ["bodies answered 200 more than once (simulator)", server["repeated_ok"]],
            ["summary.json byte-identical to the uninterrupted run", same_summary],
            ["summary rows equal", ref_rows == res_rows],
            ["queries.jsonl byte-identical", same_records],
        ]}],
        goals=[Goal("extra requests = requests in flight at the kills", float(ok_extra), "yes", ok_extra),
               Goal("final summary.json identical", float(identical), "yes", identical)],
        notes=[
            f"`python -m evaluator --model sim --model sim-b --runs 4 --limit {LIMIT} --concurrency {CONCURRENCY} "
            "--base-url URL --cache-dir TMP --out TMP --no-progress`; simulator latency lognormal, median "
            f"{SIM['latency_s']} s; kill points at seeded random shares of the needed calls (seed {SEED})",
            "lost = requests sent - replies stored in that attempt: replies in flight when SIGKILL came; each is at most "
            f"the engines' {2 * CONCURRENCY} concurrent slots; the snapshot is read ~10 ms before the kill",
            f"uninterrupted run: {ref_wall:.1f} s, {needed:,} requests, {needed_entries:,} cached replies",
        ],
        data={"needed": needed, "needed_entries": needed_entries, "attempts": attempts, "final": final, "server": server,
              "extra": extra, "lost": lost, "same_summary_bytes": same_summary, "same_rows": ref_rows == res_rows,
              "same_queries_jsonl": same_records, "ref_wall_s": ref_wall},
    )
