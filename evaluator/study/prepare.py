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
from evaluator.settings.paths import REPO_ROOT, resolve_path
from evaluator.settings.sections import DataSettings, EmbedSettings, RetrievalSettings, RunSettings


@dataclass
class Study:
    retrieval: RetrievalSettings  # what the searches and the runner use (the k-ablation fitted to the registry)
    run: RunSettings  # the models, runs and architectures
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


def make_embedder(embed: EmbedSettings, cache_root: Path, progress: bool = True,
                  reporter: Reporter = SILENT) -> Embedder:
    return Embedder(
        embed.model,
        device=embed.device,
        precision=embed.precision,
        backend=embed.backend,
        batch_size=embed.batch_size,
        cache_dir=cache_root,
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


def load_inputs(data: DataSettings, *, data_from_cli: bool = False) -> Inputs:
    """`data_from_cli`: `data.dir` came from --data or EVALUATOR_DATA, so it must exist (else it may fall back)."""
    t = time.perf_counter()
    warnings = Warnings()
    data_dir = None
    if not (data.tools and data.queries) or data_from_cli:
        data_dir = resolve_data_dir(data.dir if data_from_cli else None, data.dir, REPO_ROOT)
    # without --tools and --queries both, the data folder was resolved above
    tools = resolve_path(data.tools) if data.tools else _resolved(data_dir)
    registry = load_registry(tools, data.registry, warnings, fmt=data.tools_format)
    files = [resolve_path(q) for q in data.queries] if data.queries else find_query_files(_resolved(data_dir))
    queries = load_query_files(files, registry, warnings, limit=data.limit or None, subsets=list(data.subsets) or None,
                               split=data.split, subset_field=data.subset_field)
    return Inputs(data_dir, registry, queries, warnings, time.perf_counter() - t)


def prepare(inputs: Inputs, *, embed: EmbedSettings, retrieval: RetrievalSettings, run: RunSettings,
            cache_root: Path, progress: bool = True, reporter: Reporter = SILENT) -> Study:
    """`inputs` embedded by the `embed` section's model (vectors cached under `cache_root`) and RtP retrieved."""
    registry, queries = inputs.registry, inputs.queries
    timings: dict[str, float] = {"load_s": inputs.load_s}

    embedder = make_embedder(embed, cache_root, progress, reporter)
    t = time.perf_counter()
    api_vecs = embedder.encode(registry.texts(), desc="embedding registry")
    query_vecs = embedder.encode([q.text for q in queries], desc="embedding queries")
    timings["embed_s"] = time.perf_counter() - t

    t = time.perf_counter()
    index = VectorIndex(api_vecs, device=embedder.device)  # FAISS on a CPU, torch on a GPU
    retriever = make_retriever(retrieval, embedder, index, registry, reporter)
    if isinstance(retriever, Dense):
        rtp = retrieve.rtp(index, query_vecs, retrieval.k_max)  # the vectors are at hand: no second encode
    else:
        rtp = retrieve.from_hits(retriever.search([q.text for q in queries], retrieval.k_max))
    timings["rtp_search_s"] = time.perf_counter() - t
    return Study(retrieval, run, inputs.data_dir, registry, queries, embedder, api_vecs, query_vecs, index, rtp,
                 inputs.warnings, timings, retriever)


def make_retriever(retrieval: RetrievalSettings, embedder: Embedder, index: VectorIndex, registry: Registry,
                   reporter: Reporter = SILENT) -> Retriever:
    """The `--retriever` of the settings over this registry; the BM25 index from the cache when there."""
    dense = Dense(embedder, index, searches_folder(embedder.cache_dir))
    if retrieval.retriever == "dense":
        return dense
    lexical = Lexical(load_index(registry.texts(), embedder.cache_dir, reporter.warn)[0])
    return lexical if retrieval.retriever == "bm25" else Hybrid(dense, lexical)
