"""`python bench/real_model.py`: how busy the bundled llama.cpp server is kept, against its slots and threads.

The study's own prompts (`python -m evaluator requests export` on the bundled MCP example: discovery and RtP
planner requests, the shared system prompts included) are sent to the bundled server (evaluator/llamacpp) at
each (slots x threads) setting, one request in flight per slot, prompt-prefix reuse (llama.cpp's
cache_prompt) on, replies capped at `--max-tokens`. Per setting: calls/min and generated tokens/s (from the
server's usage counts, over the batch's wall time). The settings are visited in rounds (every setting once per
round, in turn) so that a machine whose load drifts loads them alike; each figure is the median over rounds.

Reported as ratios within this one run: the study's setting (`llama_server.sizing` on this machine) against the best
setting (the server saturated: the most generated tokens/s any setting reached) and against one request at a
time (1 slot). The goal (issue 28): >= 0.9x the best and >= 1.5x one-at-a-time. Writes
`bench/results/real_model.json`. Not part of `python -m bench` (it needs the `local-model` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, Stamp, stamped  # noqa: E402
from evaluator.llamacpp.llama_server import LlamaHandle, cpu_threads, sizing
from evaluator.llamacpp.weights import WEIGHTS
from evaluator.llm import load_profile

RESULT = REPO / "bench" / "results" / "real_model.json"
MEASURES = ("evaluator/llamacpp", "evaluator/llm", "bench/real_model.py")  # the code it measures (`python -m bench --check`)


def _requests(model: str, queries: int, cache: Path, work: Path) -> list[dict[str, Any]]:
    """The study's discovery and RtP planner requests for the first `queries` MCP example queries."""
    out = work / "requests.jsonl"
    fresh = work / "cache"  # no LLM reply cached: every request is exported; the embeddings are reused
    fresh.mkdir()
    for sub in ("embeddings", "exports"):
        if (cache / sub).is_dir():
            (fresh / sub).symlink_to((cache / sub).resolve())
    cmd = [sys.executable, "-m", "evaluator", "requests", "export", str(out), "--model", model, "--tools",
           str(REPO / "examples" / "mcp" / "tools"), "--queries", str(REPO / "examples" / "mcp" / "queries.jsonl"),
           "--limit", str(queries), "--runs", "1", "--cache-dir", str(fresh), "--no-progress"]
    done = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"requests export failed: {done.stderr[-2000:]}")
    return [json.loads(x)["body"] for x in out.read_text().splitlines() if x.strip()]


async def _batch(base_url: str, bodies: list[dict[str, Any]], in_flight: int, max_tokens: int) -> dict[str, float]:
    sem = asyncio.Semaphore(in_flight)
    tokens = {"prompt": 0, "completion": 0, "cached": 0}

    async def one(session: aiohttp.ClientSession, i: int, body: dict[str, Any]) -> None:
        async with sem:
            payload = {**body, "max_tokens": max_tokens, "seed": i, "cache_prompt": True}
            async with session.post(base_url + "/chat/completions", json=payload) as r:
                reply = await r.json()
                if r.status != 200:
                    raise RuntimeError(f"server answered {r.status}: {str(reply)[:300]}")
        usage = reply.get("usage") or {}
        tokens["prompt"] += int(usage.get("prompt_tokens") or 0)
        tokens["completion"] += int(usage.get("completion_tokens") or 0)
        tokens["cached"] += int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)

    t = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800), trust_env=False) as s:
        await asyncio.gather(*(one(s, i, b) for i, b in enumerate(bodies)))
    wall = time.perf_counter() - t
    return {"wall_s": wall, "calls_per_min": 60 * len(bodies) / wall, "gen_tok_s": tokens["completion"] / wall,
            "prompt_tokens": tokens["prompt"], "completion_tokens": tokens["completion"],
            "cached_prompt_tokens": tokens["cached"]}


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", choices=sorted(WEIGHTS), help="bundled model profile")
    ap.add_argument("--queries", type=int, default=3, help="MCP example queries (2 requests each)")
    ap.add_argument("--max-tokens", type=int, default=64, help="reply cap per request (short: a bench, not a study)")
    ap.add_argument("--settings", default="1x2,2x2,4x2,2x1", help="SLOTSxTHREADS, comma-separated")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cache-dir", type=Path, default=REPO / "cache", help="where the GGUF is joined (and kept)")
    ap.add_argument("--out", type=Path, default=RESULT, help="where the figures are written")
    args = ap.parse_args(argv)
    stamp = Stamp()
    out: Path = args.out
    profile = load_profile(args.model)
    default_slots, default_threads = sizing(profile.server)
    settings = [tuple(int(x) for x in s.split("x")) for s in args.settings.split(",")]
    if (default_slots, default_threads) not in settings:
        settings.append((default_slots, default_threads))
    w = WEIGHTS[profile.server.local_model or ""]
    with tempfile.TemporaryDirectory() as tmp:
        bodies = _requests(args.model, args.queries, args.cache_dir, Path(tmp))
    runs: dict[str, list[dict[str, float]]] = {f"{s}x{t}": [] for s, t in settings}
    loads = [_load()]
    out.parent.mkdir(parents=True, exist_ok=True)
    for r in range(args.rounds):
        for slots, threads in settings:
            with LlamaHandle(w, args.cache_dir, slots=slots, threads=threads, ctx=profile.server.ctx) as srv:
                base = srv.base_url
                asyncio.run(_batch(base, bodies[:slots], slots, 8))  # warm: the shared system prompts cached
                runs[f"{slots}x{threads}"].append(asyncio.run(_batch(base, bodies, slots, args.max_tokens)))
            print(f"{slots} slots x {threads} threads: {runs[f'{slots}x{threads}'][-1]['gen_tok_s']:.2f} gen tok/s",
                  file=sys.stderr)
            # what is measured so far, so that a run stopped early still leaves its figures
            out.with_suffix(".partial.json").write_text(json.dumps(
                {"round": r, "load": [*loads, _load()], "runs": runs, "requests": len(bodies),
                 "max_tokens": args.max_tokens}, indent=1) + "\n")
        loads.append(_load())
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("calls_per_min", "gen_tok_s", "wall_s")}
           for k, v in runs.items()}
    best = max(med, key=lambda k: med[k]["gen_tok_s"])
    study = f"{default_slots}x{default_threads}"
    single = next((k for k in med if k.startswith("1x") and k.endswith(f"x{default_threads}")), None)
    result = {
        "bench": "real_model", "model": args.model, "requests": len(bodies), "max_tokens": args.max_tokens,
        "rounds": args.rounds, "cpu_threads": cpu_threads(), "load": loads, "study_setting": study,
        "best_setting": best, "one_at_a_time_setting": single, "settings": med, "runs": runs,
        "study_vs_best": med[study]["gen_tok_s"] / med[best]["gen_tok_s"],
        "study_vs_one_at_a_time": (med[study]["gen_tok_s"] / med[single]["gen_tok_s"]) if single else None,
        "goals": {"study_vs_best": ">= 0.9", "study_vs_one_at_a_time": ">= 1.5"},
        "profile": profile.flat(),  # flat, as meta.json saves a profile
    }
    out.write_text(json.dumps(stamped(result, stamp), indent=1) + "\n")
    print(f"{'setting':>8} {'calls/min':>10} {'gen tok/s':>10} {'vs best':>8}")
    for k, v in med.items():
        print(f"{k:>8} {v['calls_per_min']:>10.2f} {v['gen_tok_s']:>10.2f} {v['gen_tok_s'] / med[best]['gen_tok_s']:>8.2f}"
              + ("  <- the study's default" if k == study else ""))
    svo = result["study_vs_one_at_a_time"]
    print(f"study setting {study}: {result['study_vs_best']:.2f}x the best ({best}), "
          + (f"{svo:.2f}x one at a time ({single})" if svo else "no one-at-a-time setting measured")
          + f"; {loads[0]} at the start, {loads[-1]} at the end. Wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
