"""Benchmark: the default embedder's runtime settings on a slice of the registry, against the fp32 floor.

The first run's embedding (`bench/embed_first_run.py` times the whole command) with its batching and
runtime settings alternated in one process on a stride sample of the registry's texts and queries
(every k-th text in token-count order, so the sample has the registry's length distribution):
- *split* (the default before issue 29's speed work): batches of at most 8,192 padded tokens, each
  split between OpenVINO's two single-threaded streams, waiting for both before padding the next;
- *streamed* (the default now): batches of at most 4,096 tokens, each whole to the next free stream
  (`AsyncInferQueue`), the next one padded while the last ones run.
Both run through `Embedder` itself (its ordering, tokenising and batches), on the export a cache folder
holds (built there first if missing). Reported per variant and round: wall seconds, CPU seconds of the
process, and the fraction of the fp32 floor both ways: the sample's forward-pass FLOPs (real tokens,
`embed_first_run.forward_flops`) per wall second over numpy sgemm's rate on all cores, and per CPU
second over sgemm's rate on one core (OpenBLAS's own kernels for this CPU, measured between the rounds).
On a shared machine the wall figures are mostly the neighbours'; the CPU-second ones are what the code
does with the cores it gets (they still drift with the neighbours' use of the caches).

    python -m bench.embed_runtime [--texts 5000] [--rounds 3] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import BENCH_CACHE, Goal, Result, Stamp, finish
from .embed_first_run import _sgemm_rates, _texts, forward_flops

NAME = "embed_runtime"
MEASURES = ("evaluator/retrieval", "evaluator/core/threads.py", "bench/embed_runtime.py")  # the code it measures (`python -m bench --check`)
TITLE = "The default embedder's batching on a registry sample: streamed vs split, as fractions of the fp32 floor"
VARIANTS = ("split (before)", "streamed (now)")
FFN = (4096, 384, 1536)  # the model's largest product: 4,096 tokens through the feed-forward


def _embedder(cache: Path, variant: str):
    from evaluator.retrieval import backends
    from evaluator.retrieval.embed import Embedder

    work = Path(tempfile.mkdtemp(prefix="bench-embed-runtime-"))
    os.environ[backends.SHARED_EXPORTS_ENV] = str(cache)  # the export linked from `cache`, never re-made per variant
    e = Embedder(backend="openvino", precision="fp32", cache_dir=work, progress=False)
    e.encode(["warm: the export is linked and the runtime compiled"])
    e.store = None  # every round embeds the sample afresh
    if variant == VARIANTS[0]:
        run = e._runner

        def split(feats: dict[str, np.ndarray]) -> np.ndarray:
            return run(feats)  # no `stream`, no `batch_tokens`: one batch at a time, 8,192 tokens

        split.release = run.release  # type: ignore[attr-defined]
        e._runner = split
    return e


def _sample(texts: list[str], n: int, e) -> list[str]:
    ids = e._tokenizer.ids(texts)
    order = np.argsort(-ids.lengths, kind="stable")
    return [texts[i] for i in order[(np.arange(min(n, len(order))) * len(order) / min(n, len(order))).astype(int)]]


def run(n_texts: int = 5000, rounds: int = 3, cache: Path = BENCH_CACHE) -> Result:
    from evaluator.core import threads
    from evaluator.retrieval.embed import _key

    embedders = {v: _embedder(cache, v) for v in VARIANTS}
    first = embedders[VARIANTS[0]]
    sample = _sample(_texts(), n_texts, first)
    lens = first._tokenizer.ids(sample).lengths
    flops = forward_flops(lens)
    cores = threads.available_cpus()
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}  # the CPU's own kernels
    keys = [_key(t) for t in sample]  # distinct: the texts are
    rows: list[list[Any]] = []
    per: dict[str, dict[str, list[float]]] = {v: {"wall": [], "cpu": [], "of_floor": [], "of_floor_cpu": []}
                                              for v in VARIANTS}
    vecs: dict[str, np.ndarray] = {}
    sgemm: list[dict[str, Any]] = []
    for r in range(rounds):
        one = _sgemm_rates([FFN], env, threads=1)
        every = _sgemm_rates([FFN], env, threads=cores)
        sgemm.append({"one_core_per_cpu_s": one["cpu_rates"], "all_cores": every["rates"], "kernels": one["kernels"]})
        rate_cpu = max(one["cpu_rates"].values()) * 1e9
        rate_wall = max(every["rates"].values()) * 1e9
        for v in VARIANTS if r % 2 == 0 else reversed(VARIANTS):
            e = embedders[v]
            load = os.getloadavg()[0]
            c0, t0 = time.process_time(), time.perf_counter()
            got = e._embed(sample, keys, "bench", False)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            vecs[v] = np.stack([got[k] for k in keys])
            per[v]["wall"].append(wall)
            per[v]["cpu"].append(cpu)
            per[v]["of_floor"].append(flops / wall / rate_wall)
            per[v]["of_floor_cpu"].append(flops / cpu / rate_cpu)
            rows.append([r, v, round(wall, 2), round(cpu, 2), round(flops / wall / 1e9, 1), round(flops / cpu / 1e9, 1),
                         round(flops / wall / rate_wall, 3), round(flops / cpu / rate_cpu, 3), round(load, 1)])
    diff = float(np.abs(vecs[VARIANTS[0]] - vecs[VARIANTS[1]]).max())
    a, b = VARIANTS
    cpu_ratio = [x / y for x, y in zip(per[a]["cpu"], per[b]["cpu"], strict=True)]
    wall_ratio = [x / y for x, y in zip(per[a]["wall"], per[b]["wall"], strict=True)]
    best = max(per[b]["of_floor_cpu"])
    one_core = ", ".join(f"{max(g['one_core_per_cpu_s'].values()):.0f}" for g in sgemm)
    all_cores = ", ".join(f"{max(g['all_cores'].values()):.0f}" for g in sgemm)
    return Result(
        name=NAME, title=TITLE,
        columns=["round", "variant", "wall s", "CPU s", "GFLOP/s", "GFLOP per CPU s", "of floor (wall)",
                 "of floor (CPU s)", "load 1m"],
        rows=rows,
        goals=[Goal("streamed: fraction of the fp32 floor per CPU second (best round)", best, ">= 0.85", best >= 0.85),
               Goal("max |vector difference| streamed vs split", diff, "<= 1e-5", diff <= 1e-5)],
        notes=[f"{len(sample):,} texts (stride sample of the registry and queries in token order), {int(lens.sum()):,} "
               f"real tokens, {flops / 1e12:.2f} TFLOP of fp32 forward passes; {rounds} rounds, order alternated",
               f"split / streamed CPU seconds per round: {', '.join(f'{x:.3f}' for x in cpu_ratio)}; "
               f"wall: {', '.join(f'{x:.3f}' for x in wall_ratio)}",
               "floor per CPU second: numpy sgemm on one core, (4,096 x 384) @ (384 x 1,536), "
               f"{one_core} GFLOP per CPU second; on all {cores} cores {all_cores} GFLOP/s "
               f"(wall); OpenBLAS kernels {sgemm[0]['kernels']}, measured before each round",
               f"the runtime: {embedders[b].description}",
               "wall-time figures on a loaded machine are the neighbours': re-measure quiet"],
        data={"per_variant": per, "sgemm": sgemm, "tflop": flops / 1e12, "tokens": int(lens.sum()),
              "texts": len(sample), "max_vector_diff": diff, "cpu_ratio": cpu_ratio, "wall_ratio": wall_ratio},
    )


def main() -> None:

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache-dir", type=Path, default=BENCH_CACHE, help="where the model export is (or is made)")
    a = ap.parse_args()
    t0 = time.perf_counter()
    st = Stamp()
    r = run(a.texts, a.rounds, a.cache_dir)
    finish(r, t0, st, "bench.embed_runtime")


if __name__ == "__main__":
    main()
