"""Benchmark 5: peak memory of the full offline study (47k registry, 3 subsets, 4 runs, 2 simulated models).

`python -m evaluator --model sim --model sim-b --runs 4` runs as a subprocess; it starts one simulator
per model itself. A sampler sums the RSS of the whole process tree every 50 ms. The LLM cache is
fresh (every call is made); embeddings come from the project's cache, linked, as on any run after
the first `--retrieval-only`; stubs missing from it are embedded (the note says how many).
"""

from __future__ import annotations

import subprocess
import time

import orjson

from .common import PROJECT_CACHE, PYTHON, REPO, Goal, Result, TreeRSS, link_embeddings, temp_dir

NAME = "memory"
TITLE = "5. Peak RSS of the full offline study (process tree incl. simulators)"
BUDGET_GIB = 4.0  # a laptop-friendly ceiling; the machine has 24 GiB


def run() -> Result:
    with temp_dir("memory") as tmp:
        cache, out, log = tmp / "cache", tmp / "out", tmp / "evaluator.log"
        link_embeddings(cache, (PROJECT_CACHE,))
        cmd = [PYTHON, "-m", "evaluator", "--model", "sim", "--model", "sim-b", "--runs", "4", "--cache-dir", str(cache),
               "--out", str(out), "--no-progress"]
        t0 = time.perf_counter()
        with open(log, "wb") as fh:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            with TreeRSS(proc.pid) as rss:
                rc = proc.wait()
        wall = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"evaluator exited with {rc}:\n{log.read_text()[-2000:]}")
        meta = orjson.loads((out / "meta.json").read_bytes())
        records = sum(1 for _ in (out / "queries.jsonl").open())

    peak_gib = rss.peak / 2**30
    calls = sum(v["calls"] for v in meta["llm_stats"].values())
    rows = [["whole tree (summed at each sample)", round(rss.peak / 2**20)]]
    rows += [[f"{name} (its own peak)", round(v / 2**20)] for name, v in sorted(rss.peak_by_name.items())]
    timings = meta.get("runtime", {}).get("timings", {})
    embed = meta.get("runtime", {}).get("embed", {})
    return Result(
        name=NAME, title=TITLE, columns=["process", "peak RSS MiB"], rows=rows,
        goals=[Goal("peak RSS of the tree, GiB", peak_gib, f"<= {BUDGET_GIB:g}", peak_gib <= BUDGET_GIB)],
        notes=[
            f"`python -m evaluator --model sim --model sim-b --runs 4 --cache-dir TMP --out TMP --no-progress`: "
            f"{meta['registry']['size']:,} APIs, {sum(meta['subsets'].values())} queries, {calls:,} LLM calls, "
            f"{records:,} records, {wall:.0f} s wall ({', '.join(f'{k} {v:.1f}s' for k, v in timings.items())})",
            f"{rss.samples:,} samples every 50 ms; 'evaluator.sim' is the larger of the two simulators",
            f"embedder: {embed.get('embedded', 0):,} texts embedded in this run, {embed.get('cache_hits', 0):,} from the cache "
            "(registry vectors linked from the project cache; stubs already there are not re-embedded)",
        ],
        data={"peak_bytes": rss.peak, "peak_by_process": rss.peak_by_name, "wall_s": wall, "samples": rss.samples,
              "calls": calls, "records": records, "timings": timings, "embed": embed},
    )
