"""The prepared study: data loaded, everything embedded, RtP retrieved; shared by every run.

Preparing is model-independent, so it happens once per invocation however many models and runs
follow, and its embeddings come from the on-disk cache on every later invocation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import retrieve
from .config import REPO_ROOT, Settings
from .data import (
    Query,
    Registry,
    Warnings,
    find_query_files,
    load_queries,
    load_registry,
    resolve_data_dir,
    select_subsets,
)
from .embed import Embedder
from .index import VectorIndex


@dataclass
class Study:
    settings: Settings
    data_dir: Path
    registry: Registry
    queries: list[Query]
    embedder: Embedder
    api_vecs: np.ndarray
    query_vecs: np.ndarray
    index: VectorIndex
    rtp: list[retrieve.Retrieved]
    warnings: Warnings
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def subsets(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for q in self.queries:
            out[q.subset] = out.get(q.subset, 0) + 1
        return out


def make_embedder(s: Settings, progress: bool = True) -> Embedder:
    return Embedder(
        s.embedder,
        device=s.device,
        precision=s.precision,
        batch_size=s.batch_size,
        cache_dir=s.resolve_path(s.cache_dir),
        progress=progress,
    )


def prepare(s: Settings, progress: bool = True) -> Study:
    timings: dict[str, float] = {}
    t = time.perf_counter()
    warnings = Warnings()
    data_dir = resolve_data_dir(s.data_dir if s.data_from_cli else None, s.data_dir, REPO_ROOT)
    registry = load_registry(data_dir, s.registry, warnings)
    files = select_subsets(find_query_files(data_dir), s.subsets or None)
    queries = [q for f in files for q in load_queries(f, registry, warnings, limit=s.limit or None)]
    timings["load_s"] = time.perf_counter() - t

    embedder = make_embedder(s, progress)
    t = time.perf_counter()
    api_vecs = embedder.encode(registry.texts(), desc="embedding registry")
    query_vecs = embedder.encode([q.text for q in queries], desc="embedding queries")
    timings["embed_s"] = time.perf_counter() - t

    t = time.perf_counter()
    index = VectorIndex(api_vecs)
    rtp = retrieve.rtp(index, query_vecs, s.k_max)
    timings["rtp_search_s"] = time.perf_counter() - t
    return Study(s, data_dir, registry, queries, embedder, api_vecs, query_vecs, index, rtp, warnings, timings)
