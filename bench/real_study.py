"""`python bench/real_study.py --minutes 25`: the study on the bundled real model, on a seeded stratified sample.

Each ToolBench subset's queries are shuffled once with `--seed`; pass n studies the first `n` of every subset
(n = `--step`, 2x`--step`, ... up to `--per-subset`), so the samples nest and each pass sends only the
queries the last one did not have (the response cache keeps the rest). A pass is started only while
`--minutes` are left, estimated from the last pass's calls/min; the last pass that finished is the recorded
study: its output folder (`bench/results/real_study/`), and `bench/results/real_study.json` with the
sample, wall time, calls/min, the server's busy share, the load, and the main table's rows.
Not part of `python -m bench`: it needs the `local-model` extra and tens of minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, Stamp, stamped  # noqa: E402
from evaluator.analysis.metric_defs import NWAY_METRICS  # noqa: E402

RESULTS = REPO / "bench" / "results"
MEASURES = ("evaluator", "bench/real_study.py")  # the code it measures (`python -m bench --check`)
METRICS = NWAY_METRICS  # the main table's rows it records: the metrics every architecture is compared on


def _sample(data: Path, per_subset: int, seed: int) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for f in sorted((data / "queries").glob("G*_instruction.json")):
        recs = json.loads(f.read_text())
        random.Random(f"{seed}:{f.stem}").shuffle(recs)
        out[f.stem] = recs[:per_subset]
    return out


def _write(sample: dict[str, list[dict[str, Any]]], n: int, folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for subset, recs in sample.items():
        path = folder / f"{subset}.json"  # the file's stem names the subset, as in the data folder
        path.write_text(json.dumps(recs[:n]))
        paths.append(str(path))
    return paths


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f} (1/5/15 min) on {os.cpu_count()} cores"


def _pass(args: argparse.Namespace, n: int, work: Path) -> dict[str, Any]:
    out = work / f"pass-{n}"
    shutil.rmtree(out, ignore_errors=True)
    queries = _write(_sample(args.data, args.per_subset, args.seed), n, work / f"queries-{n}")
    cmd = [sys.executable, "-m", "evaluator", "--model", args.model, "--data", str(args.data), "--queries", *queries,
           "--runs", "1", "--archs", args.archs, "--no-extras", "--no-progress", "--cache-dir", str(args.cache_dir), "--out", str(out)]
    load0, t = _load(), time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    wall = time.monotonic() - t
    if done.returncode not in (0, 3):
        sys.exit(f"pass {n} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    meta = json.loads((out / "meta.json").read_text())
    stats = meta["llm_stats"][args.model]
    server = meta["runtime"].get("local_server", {}).get(args.model, {})
    llm_s = meta["runtime"]["timings"].get("llm_s") or wall
    metrics = server.get("metrics", {})
    return {"per_subset": n, "out": str(out), "wall_s": wall, "llm_s": llm_s, "requests": stats["requests"],
            "cache_hits": stats["cache_hits"], "failed": stats["failed"], "truncated": stats["truncated"],
            "prompt_tokens": stats["prompt_tokens"], "completion_tokens": stats["completion_tokens"],
            "calls_per_min": 60 * stats["requests"] / llm_s if stats["requests"] else None,
            "gen_tok_s": stats["completion_tokens"] / llm_s if stats["requests"] else None,
            # slot-seconds spent generating and reading prompts over the slots' wall time in the LLM stage
            "server_busy_share": ((metrics.get("tokens_predicted_seconds_total", 0) + metrics.get("prompt_seconds_total", 0))
                                  / (llm_s * server["slots"])) if metrics and server.get("slots") else None,
            "server": {k: v for k, v in server.items() if k != "metrics"}, "server_metrics": metrics,
            "load_start": load0, "load_end": _load(), "rc": done.returncode}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "toolbench")
    ap.add_argument("--per-subset", type=int, default=20)
    ap.add_argument("--step", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--minutes", type=float, default=60.0, help="wall time for the whole study")
    ap.add_argument("--cache-dir", type=Path, default=REPO / "cache")
    ap.add_argument("--archs", default="rtp,ptr", help="the study's --archs (each more one costs calls per query)")
    args = ap.parse_args(argv)
    stamp = Stamp()
    work = RESULTS / "real_study.work"
    deadline = time.monotonic() + 60 * args.minutes
    passes: list[dict[str, Any]] = []
    n = args.step
    while n <= args.per_subset:
        left = deadline - time.monotonic()
        if passes:  # the next pass sends `step` more queries per subset, at the last pass's pace
            last = passes[-1]
            per_query = last["llm_s"] / max(1, last["per_subset"] - (passes[-2]["per_subset"] if len(passes) > 1 else 0))
            if per_query * args.step > left:
                break
        p = _pass(args, n, work)
        passes.append(p)
        print(f"pass {n}/subset: {p['requests']} requests in {p['llm_s']:.0f} s "
              f"({p['calls_per_min'] or 0:.2f}/min), load {p['load_end']}", file=sys.stderr, flush=True)
        n += args.step
    if not passes:
        sys.exit("no pass finished")
    final = passes[-1]
    dest = RESULTS / "real_study"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(final["out"], dest)
    summary = json.loads((dest / "summary.json").read_text())
    rows = [r for r in summary["rows"] if r["metric"] in METRICS and r["k"] in (5, None)]
    result = {"bench": "real_study", "model": args.model, "archs": args.archs, "seed": args.seed, "per_subset": final["per_subset"],
              "asked_per_subset": args.per_subset, "minutes": args.minutes, "passes": passes, "rows": rows,
              "total_wall_s": sum(p["wall_s"] for p in passes),
              "requests_total": sum(p["requests"] for p in passes),
              "llm_s_total": sum(p["llm_s"] for p in passes)}
    (RESULTS / "real_study.json").write_text(json.dumps(stamped(result, stamp), indent=1) + "\n")
    print(f"recorded pass {final['per_subset']}/subset in {dest}; {RESULTS / 'real_study.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
