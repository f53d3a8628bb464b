"""The prepared study: data loaded, everything embedded, RtP retrieved; shared by every run.

Preparing is model-independent, so it happens once per invocation however many models and runs
follow, and its embeddings come from the on-disk cache on every later invocation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evaluator.core.progress import SILENT, Reporter
from evaluator.data import (
    Query,
    Registry,
    Warnings,
    find_query_files,
    load_query_files,
    load_registry,
    resolve_data_dir,
)
from evaluator.retrieval import search as retrieve
from evaluator.retrieval.embed import Embedder
from evaluator.retrieval.index import VectorIndex, searches_folder
from evaluator.retrieval.lexical import load_index
from evaluator.retrieval.retrievers import Dense, Hybrid, Lexical, Retriever
from evaluator.settings.load import REPO_ROOT, Settings


@dataclass
class Study:
    settings: Settings
    data_dir: Path | None
    registry: Registry
    queries: list[Query]
    embedder: Embedder
    api_vecs: np.ndarray
    query_vecs: np.ndarray
    index: VectorIndex
    rtp: list[retrieve.Retrieved]
    warnings: Warnings
    timings: dict[str, float] = field(default_factory=dict)
    retriever: Retriever | None = None  # what every architecture searches with (None: dense over `index`)

    @property
    def subsets(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for q in self.queries:
            out[q.subset] = out.get(q.subset, 0) + 1
        return out


def make_embedder(s: Settings, progress: bool = True, reporter: Reporter = SILENT) -> Embedder:
    return Embedder(
        s.embedder,
        device=s.device,
        precision=s.precision,
        backend=s.backend,
        batch_size=s.batch_size,
        cache_dir=s.resolve_path(s.cache_dir),
        progress=progress,
        reporter=reporter,
    )


@dataclass
class Inputs:
    """The data of a study, loaded and checked, nothing embedded yet."""

    data_dir: Path | None  # None when --tools and --queries name every input
    registry: Registry
    queries: list[Query]
    warnings: Warnings
    load_s: float


def _resolved(data_dir: Path | None) -> Path:
    assert data_dir is not None  # resolved whenever --tools or --queries is missing
    return data_dir


def load_inputs(s: Settings) -> Inputs:
    t = time.perf_counter()
    warnings = Warnings()
    data_dir = None
    if not (s.tools and s.queries) or s.data_from_cli:
        data_dir = resolve_data_dir(s.data_dir if s.data_from_cli else None, s.data_dir, REPO_ROOT)
    # without --tools and --queries both, the data folder was resolved above
    tools = s.resolve_path(s.tools) if s.tools else _resolved(data_dir)
    registry = load_registry(tools, s.registry, warnings, fmt=s.tools_format)
    files = [s.resolve_path(q) for q in s.queries] if s.queries else find_query_files(_resolved(data_dir))
    queries = load_query_files(files, registry, warnings, limit=s.limit or None, subsets=s.subsets or None)
    return Inputs(data_dir, registry, queries, warnings, time.perf_counter() - t)


def prepare(s: Settings, progress: bool = True, inputs: Inputs | None = None, *,
            reporter: Reporter = SILENT) -> Study:
    inputs = inputs or load_inputs(s)
    registry, queries = inputs.registry, inputs.queries
    timings: dict[str, float] = {"load_s": inputs.load_s}

    embedder = make_embedder(s, progress, reporter)
    t = time.perf_counter()
    api_vecs = embedder.encode(registry.texts(), desc="embedding registry")
    query_vecs = embedder.encode([q.text for q in queries], desc="embedding queries")
    timings["embed_s"] = time.perf_counter() - t

    t = time.perf_counter()
    index = VectorIndex(api_vecs)
    retriever = make_retriever(s, embedder, index, registry, reporter)
    if isinstance(retriever, Dense):
        rtp = retrieve.rtp(index, query_vecs, s.k_max)  # the vectors are at hand: no second encode
    else:
        rtp = retrieve.from_hits(retriever.search([q.text for q in queries], s.k_max))
    timings["rtp_search_s"] = time.perf_counter() - t
    return Study(s, inputs.data_dir, registry, queries, embedder, api_vecs, query_vecs, index, rtp,
                 inputs.warnings, timings, retriever)


def make_retriever(s: Settings, embedder: Embedder, index: VectorIndex, registry: Registry,
                   reporter: Reporter = SILENT) -> Retriever:
    """The `--retriever` of the settings over this registry; the BM25 index from the cache when there."""
    dense = Dense(embedder, index, searches_folder(embedder.cache_dir))
    if s.retriever == "dense":
        return dense
    lexical = Lexical(load_index(registry.texts(), embedder.cache_dir, reporter.warn)[0])
    return lexical if s.retriever == "bm25" else Hybrid(dense, lexical)
