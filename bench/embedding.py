"""Benchmark 3: the project's embedder vs SentenceTransformer.encode, bf16 vs fp32, batched FAISS search.

Embedding: 2,000 registry texts (seeded sample) through `Embedder` without a cache and through a
direct `SentenceTransformer.encode(..., normalize_embeddings=True)` on the same model, timed in the
order E D D E so a drift of the shared machine's load cancels out of the ratio. Agreement: max abs
difference of the vectors and the 369 test queries' top-5 neighbours among the 2,000.

Search: the full 47k registry vectors (from the project's warm cache) in `VectorIndex`; one batched
search for all test queries vs one call per query, with FAISS's default threads and with one thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from evaluator.retrieval.embed import Embedder
from evaluator.retrieval.index import VectorIndex

from .common import Goal, Result
from .workload import load_study

NAME = "embedding"
MEASURES = ("evaluator/retrieval", "bench/embedding.py")  # the code it measures (`python -m bench --check`)
TITLE = "3. Embedding (project Embedder vs SentenceTransformer.encode, bf16 vs fp32) and batched FAISS search"
N_TEXTS = 2000
K = 20


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _top(q: np.ndarray, docs: np.ndarray, k: int = 5) -> np.ndarray:
    s = q.astype(np.float64) @ docs.astype(np.float64).T
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


def _agreement(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(share of queries with the same top-5 set, mean overlap@5)."""
    same = [set(x) == set(y) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    overlap = [len(set(x) & set(y)) / len(x) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    return float(np.mean(same)), float(np.mean(overlap))


def _embedding(study: Any) -> tuple[list[list[Any]], dict[str, Any]]:
    from sentence_transformers import SentenceTransformer

    texts = study.registry.texts()
    idx = np.random.default_rng(0).choice(len(texts), N_TEXTS, replace=False)
    sample = [texts[i] for i in idx]
    queries = [q.text for q in study.queries]
    proj = Embedder(study.embedder.model_name, device="cpu", precision="fp32", cache_dir=None, progress=False)
    bf16 = Embedder(study.embedder.model_name, device="cpu", precision="bf16", cache_dir=None, progress=False)
    direct = SentenceTransformer(proj.load_path, device="cpu")
    warm = sample[:64]  # model load, first-call allocations and kernel selection stay out of the timings
    proj.encode(warm)
    bf16.encode(warm)
    direct.encode(warm, batch_size=proj.batch_size, normalize_embeddings=True)

    def enc_direct() -> np.ndarray:
        return direct.encode(sample, batch_size=proj.batch_size, normalize_embeddings=True, convert_to_numpy=True)

    t_e1, v_proj = _timed(lambda: proj.encode(sample))
    t_d1, v_direct = _timed(enc_direct)
    t_b1, v_bf16 = _timed(lambda: bf16.encode(sample))
    t_b2, _ = _timed(lambda: bf16.encode(sample))
    t_d2, _ = _timed(enc_direct)
    t_e2, _ = _timed(lambda: proj.encode(sample))
    q32 = proj.encode(queries)
    q16 = bf16.encode(queries)

    top_proj, top_direct = _top(q32, v_proj), _top(q32, v_direct)
    top_bf16 = _top(q16, v_bf16)
    same_d, ov_d = _agreement(top_proj, top_direct)
    same_b, ov_b = _agreement(top_proj, top_bf16)
    e, d, b = (t_e1 + t_e2) / 2, (t_d1 + t_d2) / 2, (t_b1 + t_b2) / 2
    rows = [
        ["SentenceTransformer.encode (fp32)", round(N_TEXTS / d, 1), 1.0, "-", "-", "-"],
        ["project Embedder, fp32, no cache", round(N_TEXTS / e, 1), round(d / e, 3),
         float(np.abs(v_proj - v_direct).max()), same_d, ov_d],
        ["project Embedder, bf16, no cache", round(N_TEXTS / b, 1), round(d / b, 3),
         float(np.abs(v_proj - v_bf16).max()), same_b, ov_b],
    ]
    data = {"texts": N_TEXTS, "queries": len(queries), "seconds": {"embedder": [t_e1, t_e2], "direct": [t_d1, t_d2],
            "bf16": [t_b1, t_b2]}, "bf16_vs_fp32_speed": e / b}
    return rows, data


def _search(index: VectorIndex, qv: np.ndarray) -> tuple[list[list[Any]], dict[str, Any]]:
    import faiss

    default_threads = faiss.omp_get_max_threads()
    rows: list[list[Any]] = []
    data: dict[str, Any] = {"faiss_default_threads": default_threads}
    for threads in (default_threads, 1):
        faiss.omp_set_num_threads(threads)
        for name, fn in (("FAISS search", index.search), ("exact_search (the stage's)", index.exact_search)):
            fn(qv[:8], K)  # warm-up
            t_batch = min(_timed(lambda fn=fn: fn(qv, K))[0] for _ in range(3))
            t_each, per = _timed(lambda fn=fn: [fn(qv[i : i + 1], K) for i in range(len(qv))])
            _, batched = fn(qv, K)
            same = float(np.mean([np.array_equal(batched[i], per[i][1][0]) for i in range(len(qv))]))
            rows.append([f"{name}, {threads} thread{'s' if threads > 1 else ''}", round(1e3 * t_batch, 1),
                         round(1e3 * t_each, 1), round(t_each / t_batch, 1), same])
            data[f"{name}|{threads}"] = {"batched_s": t_batch, "per_query_s": t_each, "same_ids": same}
    faiss.omp_set_num_threads(default_threads)
    return rows, data


def run() -> Result:
    study = load_study(n_queries=None)  # the 369 test queries as they are
    emb_rows, emb = _embedding(study)
    qv = study.embedder.encode([q.text for q in study.queries])
    search_rows, srch = _search(study.index, qv)
    ratio = emb_rows[1][2]
    batched_gain = search_rows[0][3]
    return Result(
        name=NAME, title=TITLE,
        columns=["embedder", "texts/s", "speed vs direct", "max abs diff vs Embedder fp32", "same top-5 (share of queries)",
                 "overlap@5"],
        rows=emb_rows,
        extra_tables=[{
            "title": f"FAISS: {len(qv)} queries x {len(study.index):,} registry vectors, top-{K}",
            "columns": ["search", "batched ms", "per-query ms (all)", "per-query / batched", "same ids (share)"],
            "rows": search_rows,
        }],
        goals=[Goal("Embedder speed / direct encode", ratio, ">= 0.95 (about 1 or better)", ratio >= 0.95),
               Goal("batched / per-query search speed-up", batched_gain, "> 1", batched_gain > 1)],
        notes=[
            f"{N_TEXTS:,} registry texts, seeded sample; speeds are the mean of two timings in the order E D (bf16 x2) D E",
            f"bf16 vs fp32 (Embedder): {emb['bf16_vs_fp32_speed']:.2f}x the speed; neighbours compared on the "
            "test queries embedded in the same precision",
            "'same ids' compares the batched call's top-20 rows with the per-query calls' rows, query by query",
        ],
        data={"embedding": emb, "search": srch},
    )
