"""Benchmark: does the LLM engine use a rate limit fully, without errors, and is it fast?

Rate run: a simulator enforcing 600 RPM (token bucket, one second of burst) with 1 s latency answers
1,200 distinct calls; the floor is 1,200 / 600 = 2 minutes. `--scale S` divides the latency and
multiplies the RPM by S (floor / S) to shorten it. Goal: wall time <= 1.1x the floor, zero errors.
`--blind` adds a run where the client is not told the limit and must live on the simulator's 429s.
`--throughput` adds raw speed: fresh calls/s (engine + cache writes) and cached calls/s against a
zero-latency simulator.

    .venv/bin/python bench/llm_rate.py --scale 4 --blind --throughput

Writes `bench/results/llm_rate-<time>.json` and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Stamp, stamped  # noqa: E402
from evaluator.llm import LLMEngine, ModelProfile, load_profile, revised  # noqa: E402
from simulator.harness import start_simulator  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MEASURES = ("evaluator/llm", "simulator", "bench/llm_rate.py")  # the code it measures (`python -m bench --check`)


def _messages(i: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are the planning step of an LLM agent. Answer with JSON only."},
        {"role": "user", "content": f"User request:\nbook a table for {i % 9 + 1} people, request #{i}\n\nAvailable APIs:\n"
         + "\n".join(f"- Tool{j}/api_{j}: does thing {j}" for j in range(5))},
    ]


async def _run_calls(profile: ModelProfile, cache_root: Path, n: int) -> dict[str, Any]:
    async with LLMEngine(profile, cache_root=cache_root) as llm:
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(llm.chat(_messages(i), run=0, prompt_version="bench") for i in range(n)), return_exceptions=True
        )
        wall = time.perf_counter() - t0
    raised = [r for r in results if isinstance(r, BaseException)]
    errors = [r for r in results if not isinstance(r, BaseException) and r.error is not None]
    return {"wall_s": wall, "raised": len(raised), "errors": len(errors), "engine": llm.stats.as_dict()}


def rate_run(scale: float, calls: int, rpm: float, latency_s: float, style: str, blind: bool) -> dict[str, Any]:
    server_rpm = rpm * scale
    with start_simulator(rpm=server_rpm, burst_s=1.0, latency_s=latency_s / scale, rate_style=style) as sim:
        profile = revised(
            load_profile("sim", base_url=sim.base_url), rpm=None if blind else server_rpm, concurrency=64
        )
        with tempfile.TemporaryDirectory() as root:
            res = asyncio.run(_run_calls(profile, Path(root), calls))
        server = sim.stats()
    floor = calls / server_rpm * 60.0
    return {
        "kind": "rate", "scale": scale, "calls": calls, "server_rpm": server_rpm, "latency_s": latency_s / scale,
        "style": style, "client_knows_rpm": not blind, "floor_s": floor, "ratio": res["wall_s"] / floor,
        "server_429": server["by_status"].get("429", 0), "server_max_in_flight": server["max_in_flight"], **res,
    }


def throughput_run(calls: int) -> dict[str, Any]:
    with start_simulator() as sim, tempfile.TemporaryDirectory() as root:
        profile = revised(load_profile("sim", base_url=sim.base_url), concurrency=128)
        fresh = asyncio.run(_run_calls(profile, Path(root), calls))
        cached = asyncio.run(_run_calls(profile, Path(root), calls))
    return {
        "kind": "throughput", "calls": calls, "cpus": os.cpu_count(),
        "fresh_calls_per_s": calls / fresh["wall_s"], "cached_calls_per_s": calls / cached["wall_s"],
        "fresh": fresh, "cached": cached,
    }


def _print(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="LLM engine benchmark (simulator on loopback)")
    for col in ("run", "calls", "wall s", "floor s", "ratio", "429s", "errors", "raised", "result"):
        t.add_column(col, justify="right")
    for r in rows:
        if r["kind"] == "rate":
            name = f"{r['style']} {r['server_rpm']:g}rpm {r['latency_s']:g}s {'paced' if r['client_knows_rpm'] else 'blind'}"
            ok = r["ratio"] <= 1.1 and r["errors"] == 0 and r["raised"] == 0
            t.add_row(name, str(r["calls"]), f"{r['wall_s']:.1f}", f"{r['floor_s']:.1f}", f"{r['ratio']:.3f}",
                      str(r["server_429"]), str(r["errors"]), str(r["raised"]), "PASS" if ok else "FAIL (>1.1x)")
        else:
            for what in ("fresh", "cached"):
                rate = r[f"{what}_calls_per_s"]
                goal = 1000 if what == "fresh" else 10000
                t.add_row(f"throughput, {what}", str(r["calls"]), f"{r[what]['wall_s']:.2f}", "-", f"{rate:,.0f}/s",
                          "-", str(r[what]["errors"]), str(r[what]["raised"]), "PASS" if rate >= goal else f"FAIL (goal {goal}/s)")
    Console(width=max(120, Console().width)).print(t)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="divide latency and multiply RPM by this")
    ap.add_argument("--calls", type=int, default=1200)
    ap.add_argument("--rpm", type=float, default=600.0)
    ap.add_argument("--latency-s", type=float, default=1.0)
    ap.add_argument("--style", choices=("openai", "gemini"), default="openai", help="the simulator's 429 dialect")
    ap.add_argument("--blind", action="store_true", help="also run with the client not told the RPM")
    ap.add_argument("--throughput", action="store_true", help="also measure fresh and cached calls/s")
    ap.add_argument("--throughput-calls", type=int, default=5000)
    args = ap.parse_args(argv)
    stamp = Stamp()

    print(f"scale {args.scale:g}: {args.calls} calls at {args.rpm * args.scale:g} RPM, latency {args.latency_s / args.scale:g}s, "
          f"floor {args.calls / (args.rpm * args.scale) * 60:.1f}s", flush=True)
    rows = [rate_run(args.scale, args.calls, args.rpm, args.latency_s, args.style, blind=False)]
    if args.blind:
        rows.append(rate_run(args.scale, args.calls, args.rpm, args.latency_s, args.style, blind=True))
    if args.throughput:
        rows.append(throughput_run(args.throughput_calls))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"llm_rate-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_bytes(orjson.dumps(stamped({"argv": sys.argv[1:], "rows": rows}, stamp), option=orjson.OPT_INDENT_2))
    _print(rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
