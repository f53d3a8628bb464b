"""Benchmark 5: peak memory of the full offline study, first run (fresh cache, export included) and warm rerun.

`python -m evaluator --model sim --runs 4` runs as a subprocess twice on one temporary cache folder:
first with it empty (the model is exported, the 47k registry, the queries and the PtR stubs are
embedded, every LLM call is made), then again with everything cached, as a researcher reruns it.
A sampler reads the RSS of every process of the tree every 50 ms (the CLI, the export's child
process, the simulator): reported are the largest single process (the issue's bound: <= 1.5 GiB,
what `/usr/bin/time -v` calls the maximum resident set size) and the tree's sum, beside the figure
the run itself states in meta.json (`runtime.peak_rss_mib`, getrusage). The ratio first / warm is
load-independent; the wall times are not (the load is in the header).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson

from .common import PYTHON, REPO, Goal, Result, TreeRSS, data_dir, temp_dir

NAME = "memory"
MEASURES = ("evaluator", "simulator", "bench/memory.py")  # the code it measures (`python -m bench --check`)
TITLE = "5. Peak RSS of the offline study: first run (fresh cache, export included) and warm rerun"
BOUND_GIB = 1.5  # the largest process of the first run (issue 29): an 8 GB laptop, a 4 GB CI runner
TREE_GIB = 4.0  # the whole tree, simulators included


def _run(cache: Path, out: Path, log: Path) -> dict[str, Any]:
    cmd = [PYTHON, "-m", "evaluator", "--model", "sim", "--runs", "4", "--data", data_dir(), "--cache-dir", str(cache),
           "--out", str(out), "--no-progress"]
    # A fresh clone's first run: no folder of shared exports to link the model export from.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EVALUATOR_SHARED_EXPORTS")}
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        with TreeRSS(proc.pid) as rss:
            rc = proc.wait()
    wall = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"evaluator exited with {rc}:\n{log.read_text()[-2000:]}")
    meta = orjson.loads((out / "meta.json").read_bytes())
    rtp = [orjson.loads(line).get("rtp", {}).get("retrieved") for line in (out / "queries.jsonl").read_bytes().splitlines()]
    return {"wall_s": wall, "largest": rss.largest, "tree": rss.peak, "by_name": rss.peak_by_name,
            "samples": rss.samples, "meta_peak_mib": meta.get("runtime", {}).get("peak_rss_mib", {}),
            "embed": meta.get("runtime", {}).get("embed", {}), "timings": meta.get("runtime", {}).get("timings", {}),
            "records": len(rtp), "rtp": rtp, "registry": meta["registry"]["size"]}


def run() -> Result:
    with temp_dir("memory") as tmp:
        cache = tmp / "cache"
        first = _run(cache, tmp / "out-first", tmp / "first.log")
        warm = _run(cache, tmp / "out-warm", tmp / "warm.log")
    runs = {"first run (fresh cache)": first, "warm rerun (everything cached)": warm}
    names = sorted({n for r in runs.values() for n in r["by_name"]})
    rows = [[label, round(r["largest"] / 2**20), round(r["tree"] / 2**20),
             round(float(r["meta_peak_mib"].get("largest_process", 0))),
             *[round(r["by_name"].get(n, 0) / 2**20) for n in names], round(r["wall_s"], 1),
             f"{r['embed'].get('embedded', 0):,}"] for label, r in runs.items()]
    rows.append(["first / warm", round(first["largest"] / warm["largest"], 2), round(first["tree"] / warm["tree"], 2),
                 "", *["" for _ in names], round(first["wall_s"] / warm["wall_s"], 1), ""])
    largest_gib = first["largest"] / 2**30
    tree_gib = first["tree"] / 2**30
    same = first["rtp"] == warm["rtp"]
    return Result(
        name=NAME, title=TITLE,
        columns=["run", "largest process MiB", "whole tree MiB (summed)", "meta.json peak MiB (getrusage)",
                 *[f"{n} MiB" for n in names], "wall s", "texts embedded"], rows=rows,
        goals=[Goal("first run: peak RSS of the largest process, GiB", largest_gib, f"<= {BOUND_GIB:g}",
                    largest_gib <= BOUND_GIB),
               Goal("first run: peak RSS of the whole tree, GiB", tree_gib, f"<= {TREE_GIB:g}", tree_gib <= TREE_GIB),
               Goal("RtP retrieved lists of the first run == the warm rerun's", float(same), "yes", same)],
        notes=[f"`python -m evaluator --model sim --runs 4 --cache-dir TMP --out TMP --no-progress`, twice on one "
               f"cache folder (empty, then warm; no EVALUATOR_SHARED_EXPORTS: the first run exports the model): "
               f"{first['registry']:,} APIs, {first['records']:,} records",
               f"{first['samples']:,} + {warm['samples']:,} samples every 50 ms; 'export child' is the spawned "
               "process that exports the model (first run only); 'simulator' is the simulator",
               "first run's stages: " + ", ".join(f"{k} {v:.1f}s" for k, v in first["timings"].items()),
               "peak RSS is load-independent; wall times are not (loadavg at start and end)"],
        data={k: {kk: vv for kk, vv in r.items() if kk != "rtp"} for k, r in runs.items()} | {"rtp_identical": same},
    )
