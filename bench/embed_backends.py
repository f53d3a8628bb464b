"""Benchmark: the embedder's CPU runtime paths against torch fp32: speed and retrieval equivalence.

Speed: the same seeded sample of registry texts through every path (no cache), timed in two rounds,
the second in reverse order, so a drift of the shared machine's load cancels out of the ratios;
each path is warmed first (model load, export, first-call allocations stay out of the timings).

Equivalence (the check behind `AUTO_CPU` in evaluator/retrieval/embed.py): the full registry and the test
queries embedded by each path (kept in bench/.cache, keyed by path, reused by reruns; torch fp32's
vectors come from the project's warm cache), then RtP retrieval exactly as the stage does it
(`VectorIndex.exact_search`): the largest difference from torch fp32 in recall@k for k = 1..20 over
every gold set, and the share of queries whose top-5 list (order included) is identical. A path
passes with a difference <= 0.005 and >= 98% identical lists.

    python -m bench embed_backends                     # speed + equivalence of every installed path
    python -m bench.embed_backends --paths openvino:bf16 --no-speed
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from .common import BENCH_CACHE, Goal, Result, link_embeddings

NAME = "embed_backends"
MEASURES = ("evaluator/retrieval", "evaluator/core/threads.py", "bench/embed_backends.py")  # the code it measures (`python -m bench --check`)
TITLE = "Embedding runtime paths vs torch fp32: texts/s and RtP equivalence on the shared data"
PATHS = (("torch", "fp32"), ("torch", "bf16"), ("onnx", "fp32"), ("onnx", "int8"), ("openvino", "fp32"),
         ("openvino", "bf16"))
N_SPEED = 1000
K_MAX = 20
MAX_RECALL_DIFF = 0.005
MIN_SAME_TOP5 = 0.98


def _installed(paths):
    from evaluator.retrieval import backends

    return [(b, p) for b, p in paths if b == "torch" or backends.missing_package(b) is None]


class _Today:
    """torch fp32 as it ran before backends existed: texts sorted by characters, each shard handed
    whole to `SentenceTransformer.encode` (which re-sorts by characters and batches by count)."""

    def __init__(self) -> None:
        from evaluator.retrieval.embed import Embedder

        self.e = Embedder(backend="torch", precision="fp32", device="cpu", cache_dir=None, progress=False)
        self.e._order = lambda texts: sorted(range(len(texts)), key=lambda i: len(texts[i]))
        self.e._encode_raw = self._encode_raw
        self.description = "torch fp32, sorted by characters (before this change)"

    def _encode_raw(self, texts: list[str]) -> np.ndarray:
        emb = self.e.model.encode(texts, batch_size=self.e.batch_size, convert_to_tensor=True,
                                  show_progress_bar=False)
        vecs = emb.float().cpu().numpy()
        return vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)

    def _embed(self, *a):
        return self.e._embed(*a)


TODAY = "torch fp32, before (char-sorted)"


def speed(paths, texts: list[str], n: int = N_SPEED) -> dict[str, dict[str, Any]]:
    """texts/s per path on a seeded sample, two rounds (forward, then reversed order); the
    reference is torch fp32 as it ran before this change."""
    from evaluator.retrieval.embed import Embedder

    idx = np.random.default_rng(0).choice(len(texts), min(n, len(texts)), replace=False)
    sample = [texts[i] for i in idx]
    embedders: dict[str, Any] = {TODAY: _Today()}
    embedders |= {f"{b} {p}": Embedder(backend=b, precision=p, device="cpu", cache_dir=None, progress=False)
                  for b, p in paths}
    keys = [i.to_bytes(4, "big") for i in range(len(sample))]
    for e in embedders.values():
        e._embed(sample[:64], keys[:64], "warm", False)  # model load, export, first-call allocations
    seconds: dict[str, list[float]] = {k: [] for k in embedders}
    vecs: dict[str, np.ndarray] = {}
    for order in (list(embedders), list(reversed(embedders))):
        for name in order:
            t0 = time.perf_counter()
            got = embedders[name]._embed(sample, keys, name, False)
            seconds[name].append(time.perf_counter() - t0)
            vecs[name] = np.stack([got[k] for k in keys])
    base = float(np.mean(seconds[TODAY]))
    out = {}
    for name, e in embedders.items():
        out[name] = {"texts_per_s": len(sample) / float(np.mean(seconds[name])),
                     "speed_vs_before": base / float(np.mean(seconds[name])), "seconds": seconds[name],
                     "max_abs_diff": float(np.abs(vecs[name] - vecs[TODAY]).max()), "runtime": e.description}
    return out


def _recall(rows: np.ndarray, golds: list[set[int]], k: int) -> float:
    return float(np.mean([len(set(r[:k].tolist()) & g) / len(g) for r, g in zip(rows, golds, strict=True)]))


def equivalence(paths, progress: bool = True) -> dict[str, dict[str, Any]]:
    """Full-registry RtP of each path vs torch fp32 (see the module docstring)."""
    from evaluator.retrieval.embed import Embedder
    from evaluator.retrieval.index import VectorIndex
    from evaluator.settings.load import load_settings
    from evaluator.study.prepare import load_inputs

    link_embeddings(BENCH_CACHE)  # torch fp32 from the project's warm cache, never written there
    s = load_settings()
    inputs = load_inputs(s.data)
    reg, queries = inputs.registry, inputs.queries
    gold_sets = sorted({g for q in queries for g in q.gold})
    tops: dict[str, np.ndarray] = {}
    out: dict[str, dict[str, Any]] = {}
    for b, p in [("torch", "fp32"), *[x for x in paths if x != ("torch", "fp32")]]:
        name = f"{b} {p}"
        e = Embedder(backend=b, precision=p, device="cpu", cache_dir=BENCH_CACHE, progress=progress)
        t0 = time.perf_counter()
        api = e.encode(reg.texts(), desc=f"registry, {name}")
        qv = e.encode([q.text for q in queries], desc=f"queries, {name}")
        secs = time.perf_counter() - t0
        _, rows = VectorIndex(api).exact_search(qv, K_MAX)
        tops[name] = rows
        rec = {}
        for gs in gold_sets:
            golds = [{reg.row[i] for i in q.gold.get(gs, ()) if i in reg.row} for q in queries]
            keep = [j for j, g in enumerate(golds) if g]
            rec[gs] = [_recall(rows[keep], [golds[j] for j in keep], k) for k in range(1, K_MAX + 1)]
        out[name] = {"recall": rec, "embedded_now": e.stats.embedded, "seconds": secs}
    ref = out["torch fp32"]
    for name, r in out.items():
        diff = max(abs(a - b) for gs in gold_sets for a, b in zip(r["recall"][gs], ref["recall"][gs], strict=True))
        same5 = float(np.mean([np.array_equal(x, y) for x, y in zip(tops[name][:, :5], tops["torch fp32"][:, :5],
                                                                        strict=True)]))
        same5_set = float(np.mean([set(x) == set(y) for x, y in zip(tops[name][:, :5].tolist(),
                                                                      tops["torch fp32"][:, :5].tolist(), strict=True)]))
        r.update(max_recall_diff=diff, same_top5_lists=same5, same_top5_sets=same5_set,
                 passes=diff <= MAX_RECALL_DIFF and same5 >= MIN_SAME_TOP5, queries=len(queries),
                 registry=len(reg))
    return out


def run(paths=PATHS, do_speed: bool = True, do_equivalence: bool = True) -> Result:
    from evaluator.core import threads
    from evaluator.settings.load import load_settings
    from evaluator.study.prepare import load_inputs

    paths = _installed(paths)
    rows: list[list[Any]] = []
    data: dict[str, Any] = {"threads": threads.available_cpus(), "paths": [f"{b} {p}" for b, p in paths]}
    spd = speed(paths, load_inputs(load_settings().data).registry.texts()) if do_speed else {}
    eqv = equivalence(paths) if do_equivalence else {}
    data.update(speed=spd, equivalence=eqv)
    names = ([TODAY] if spd else []) + [f"{b} {p}" for b, p in paths]
    for name in names:
        sp, eq = spd.get(name, {}), eqv.get(name, {})
        rows.append([name, round(sp["texts_per_s"], 1) if sp else None,
                     round(sp["speed_vs_before"], 2) if sp else None, sp.get("max_abs_diff"),
                     eq.get("max_recall_diff"), eq.get("same_top5_lists"), eq.get("same_top5_sets"),
                     eq.get("passes")])
    goals = []
    fastest_ok = max((r for r in rows if r[7] and r[2]), key=lambda r: r[2], default=None)
    if fastest_ok:
        goals.append(Goal(f"fastest equivalent path ({fastest_ok[0]}) vs torch fp32 before", fastest_ok[2],
                          ">= 2.5", fastest_ok[2] >= 2.5))
    return Result(
        name=NAME, title=TITLE,
        columns=["path", "texts/s", "speed vs before", "max abs diff", "max |recall@k diff| (k=1..20)",
                 "identical top-5 lists", "identical top-5 sets", f"passes (<= {MAX_RECALL_DIFF}, >= {MIN_SAME_TOP5:.0%})"],
        rows=rows, goals=goals,
        notes=[f"speed: {N_SPEED:,} seeded registry texts, no cache, mean of two rounds (forward, reversed); "
               f"{data['threads']} threads; 'before' = torch fp32 as it ran before backends (texts sorted by "
               "characters); every other row sorts by token count",
               "max abs diff: largest vector component difference from 'before' on the speed sample",
               "a 1,000-text sample understates the token-count sort's gain (each batch spans a wider range of "
               "lengths than in the 47k registry); the full-registry figure is bench.embed_first_run's",
               "equivalence: full registry + test queries per path, RtP top-20 by VectorIndex.exact_search, "
               "recall@k over every gold set vs torch fp32"],
        data=data,
    )


def main() -> None:
    from .common import Stamp, finish

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", nargs="*", help="backend:precision, e.g. openvino:bf16 (default: all)")
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--no-equivalence", action="store_true")
    a = ap.parse_args()
    paths = tuple(tuple(x.split(":")) for x in a.paths) if a.paths else PATHS
    t0 = time.perf_counter()
    st = Stamp()
    r = run(paths, not a.no_speed, not a.no_equivalence)
    finish(r, t0, st, "bench.embed_backends")


if __name__ == "__main__":
    main()
