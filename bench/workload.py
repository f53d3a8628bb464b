"""The paper-scale workload shared by the LLM benchmarks: 500 queries, 4 runs, 2 simulated models.

ToolBench's three test subsets hold 369 queries; the paper's scale is 500, so 131 more are made by
re-asking the first 131 with a suffix (distinct prompts, so every call is a distinct request; their
RtP retrieval is the original's). Everything is deterministic: reruns send the same requests.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from evaluator.retrieval import ranking
from evaluator.retrieval.ranking import Retrieved
from evaluator.settings.load import load_settings
from evaluator.study import prompts
from evaluator.study.parse import parse_stubs, stub_text
from evaluator.study.prepare import PreparedStudy, load_inputs, prepare
from evaluator.study.runner import StubBatcher
from simulator import behaviour

from .common import BENCH_CACHE, link_embeddings

N_QUERIES = 500
RUNS = 4
MODELS = ("sim", "sim-b")
_SUFFIX = " (asked again)"


def load_study(n_queries: int | None = N_QUERIES, cache_root: Path = BENCH_CACHE) -> PreparedStudy:
    """The prepared study (registry vectors from the warm cache) grown to `n_queries` queries
    (None: the test queries as they are)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    link_embeddings(cache_root)
    s = load_settings()
    study = prepare(load_inputs(s.data), embed=s.embed, retrieval=s.retrieval, run=s.run, cache_root=cache_root,
                    progress=False)
    if n_queries is None:
        return study
    base, rtp = study.queries, study.rtp
    extra = [
        dataclasses.replace(base[i % len(base)], text=base[i % len(base)].text + _SUFFIX, query_id=10**6 + i)
        for i in range(max(0, n_queries - len(base)))
    ]
    queries = (list(base) + extra)[:n_queries]
    rtp = [rtp[i % len(base)] for i in range(len(queries))]
    return dataclasses.replace(study, queries=queries, rtp=rtp)


def discovery_replies(study: PreparedStudy, runs: int = RUNS) -> dict[tuple[int, int], str]:
    """What the simulator will answer to each (run, query) discovery call: its answer function is
    pure (messages, seed, temperature), and the engine sends seed = run, temperature 0."""
    return {
        (run, qi): behaviour.answer(prompts.discovery_messages(q.text), seed=run, temperature=0.0)
        for run in range(runs)
        for qi, q in enumerate(study.queries)
    }


def stub_texts(study: PreparedStudy, runs: int = RUNS) -> dict[tuple[int, int], list[str]]:
    """(run, query) -> the stub texts the pipeline will embed for that discovery reply."""
    out = {}
    for key, reply in discovery_replies(study, runs).items():
        stubs, _ = parse_stubs(reply)
        out[key] = [stub_text(st) for st in stubs]
    return out


def prewarm_stub_embeddings(study: PreparedStudy, runs: int = RUNS) -> dict[str, int]:
    """Embed every PtR stub the workload will produce, into the benchmark's embedding cache.

    On 2 CPU cores MiniLM embeds ~100 stub texts/s; with time compressed 10-20x the study would wait
    on that instead of on the LLM, which is not what the LLM benchmarks measure.
    """
    texts = [t for ts in stub_texts(study, runs).values() for t in ts]
    before = study.embedder.stats.embedded
    study.embedder.encode(texts, desc="prewarming stub embeddings")
    return {"stub_texts": len(texts), "unique": len(set(texts)), "embedded_now": study.embedder.stats.embedded - before}


def ptr_table(study: PreparedStudy, runs: int = RUNS) -> dict[tuple[str, ...], Retrieved]:
    """Every PtR retrieval of the workload, computed up front in one batched search.

    `exact_search` makes a query's result independent of which others share the FAISS call, so this
    is exactly what the StubBatcher's micro-batches would return.
    """
    per_query = list(dict.fromkeys(tuple(ts) for ts in stub_texts(study, runs).values() if ts))
    texts = [t for ts in per_query for t in ts]
    owners = [q for q, ts in enumerate(per_query) for _ in ts]
    vecs = study.embedder.encode(texts, desc="embedding stubs")
    s = study.retrieval
    found = ranking.ptr(study.index, vecs, owners, len(per_query), s.k_max, sorted(set(s.ks)))
    return dict(zip(per_query, found, strict=True))


class TableBatcher(StubBatcher):
    """The pipeline's StubBatcher (queue, micro-batches, worker thread) with the embed+search step
    answered from `ptr_table`: the dependency discovery -> retrieval -> planner stays, the CPU cost
    (which does not shrink when the benchmark compresses time) goes."""

    def __init__(self, study: PreparedStudy, table: dict[tuple[str, ...], Retrieved]) -> None:
        super().__init__(study)
        self.table = table

    def _search(self, per_query: list[list[str]], name: str) -> list[Retrieved]:
        self.batches += 1  # one retriever in the benchmarks (the study's): `name` does not change the table
        return [self.table[tuple(ts)] for ts in per_query]
