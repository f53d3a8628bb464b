"""The paper-scale workload shared by the LLM benchmarks: 500 queries, 4 runs, 2 simulated models.

ToolBench's three test subsets hold 369 queries; the paper's scale is 500, so 131 more are made by
re-asking the first 131 with a suffix (distinct prompts, so every call is a distinct request; their
RtP retrieval is the original's). Everything is deterministic: reruns send the same requests.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from evaluator import prompts
from evaluator.config import load_settings
from evaluator.parse import parse_stubs, stub_text
from evaluator.sim import behaviour
from evaluator.study import Study, prepare

from .common import BENCH_CACHE, link_embeddings

N_QUERIES = 500
RUNS = 4
MODELS = ("sim", "sim-b")
_SUFFIX = " (asked again)"


def load_study(n_queries: int = N_QUERIES, cache_root: Path = BENCH_CACHE) -> Study:
    """The prepared study (registry vectors from the warm cache) grown to `n_queries` queries."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    link_embeddings(cache_root)
    s = load_settings()
    s.cache_dir = str(cache_root)
    study = prepare(s, progress=False)
    base, rtp = study.queries, study.rtp
    extra = [
        dataclasses.replace(base[i % len(base)], text=base[i % len(base)].text + _SUFFIX, query_id=10**6 + i)
        for i in range(max(0, n_queries - len(base)))
    ]
    queries = (list(base) + extra)[:n_queries]
    rtp = [rtp[i % len(base)] for i in range(len(queries))]
    return dataclasses.replace(study, queries=queries, rtp=rtp)


def discovery_replies(study: Study, runs: int = RUNS) -> dict[tuple[int, int], str]:
    """What the simulator will answer to each (run, query) discovery call: its answer function is
    pure (messages, seed, temperature), and the engine sends seed = run, temperature 0."""
    return {
        (run, qi): behaviour.answer(prompts.discovery_messages(q.text), seed=run, temperature=0.0)
        for run in range(runs)
        for qi, q in enumerate(study.queries)
    }


def prewarm_stub_embeddings(study: Study, runs: int = RUNS) -> dict[str, int]:
    """Embed every PtR stub the workload will produce, into the benchmark's embedding cache.

    On 2 CPU cores MiniLM embeds ~100 stub texts/s; compressed 20x in time, the study would wait on
    that instead of on the LLM, which is not what the LLM benchmarks measure. With the vectors cached,
    the pipeline's StubBatcher still runs for real (cache lookup + FAISS search per micro-batch).
    """
    texts = []
    for reply in discovery_replies(study, runs).values():
        stubs, _ = parse_stubs(reply)
        texts += [stub_text(st) for st in stubs]
    before = study.embedder.stats.embedded
    study.embedder.encode(texts, desc="prewarming stub embeddings")
    return {"stub_texts": len(texts), "unique": len(set(texts)), "embedded_now": study.embedder.stats.embedded - before}
