"""The prepared study: data loaded, everything embedded, RtP retrieved; shared by every run.

Preparing is model-independent, so it happens once per invocation however many models and runs
follow, and its embeddings come from the on-disk cache on every later invocation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evaluator.core.paths import REPO_ROOT, resolve_path
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
from evaluator.retrieval import ranking
from evaluator.retrieval.embed import Embedder
from evaluator.retrieval.index import VectorIndex, searches_folder
from evaluator.retrieval.lexical import load_index
from evaluator.retrieval.retrievers import Dense, Hybrid, Lexical, Retriever
from evaluator.settings.sections import DataSettings, EmbedSettings, RetrievalSettings, RunSettings
from evaluator.study.archs import Lineup


@dataclass
class PreparedStudy:
    """The model-independent part of a study, made once and shared by every model and run: the data loaded, every
    API and query embedded, RtP retrieved, and the sections the runner reads."""

    retrieval: RetrievalSettings  # what the searches and the runner use (the k-ablation fitted to the registry)
    run: RunSettings  # the models, runs and architectures
    data_dir: Path | None
    registry: Registry
    queries: list[Query]
    embedder: Embedder
    api_vecs: np.ndarray
    query_vecs: np.ndarray
    index: VectorIndex
    rtp: list[ranking.Retrieved]
    warnings: Warnings
    timings: dict[str, float] = field(default_factory=dict)
    retriever: Retriever | None = None  # what every architecture searches with (None: dense over `index`)
    # A BM25 text that shares no token with the registry (it retrieves nothing): counted in `warnings`, told once.
    no_match: Callable[[str], None] = field(default=lambda _text: None, repr=False)
    warn: Callable[[str], None] = field(default=lambda _message: None, repr=False)  # a warning on stderr
    # `--archs` resolved before any work (plugins imported and checked); every runner makes its architectures from
    # it with route's τ (`runner.study_archs`). None: resolved from `run.archs` when a runner asks.
    lineup: Lineup | None = None

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
            cache_root: Path, progress: bool = True, reporter: Reporter = SILENT,
            lineup: Lineup | None = None) -> PreparedStudy:
    """`inputs` embedded by the `embed` section's model (vectors cached under `cache_root`) and RtP retrieved;
    `lineup`: the run's architectures, resolved (kept for the runners)."""
    registry, queries = inputs.registry, inputs.queries
    timings: dict[str, float] = {"load_s": inputs.load_s}

    embedder = make_embedder(embed, cache_root, progress, reporter)
    t = time.perf_counter()
    api_vecs = embedder.encode(registry.texts(), desc="embedding registry")
    query_vecs = embedder.encode([q.text for q in queries], desc="embedding queries")
    timings["embed_s"] = time.perf_counter() - t

    t = time.perf_counter()
    index = VectorIndex(api_vecs, device=embedder.device)  # FAISS on a CPU, torch on a GPU
    no_match = NoMatch(inputs.warnings, reporter.warn)
    retriever = retriever_of(retrieval.retriever, embedder, index, registry, {}, reporter.warn, no_match)
    if isinstance(retriever, Dense):
        rtp = ranking.rtp(index, query_vecs, retrieval.k_max)  # the vectors are at hand: no second encode
    else:
        rtp = ranking.from_hits(retriever.search([q.text for q in queries], retrieval.k_max))
    timings["rtp_search_s"] = time.perf_counter() - t
    return PreparedStudy(retrieval, run, inputs.data_dir, registry, queries, embedder, api_vecs, query_vecs, index, rtp,
                 inputs.warnings, timings, retriever, no_match, reporter.warn, lineup)


class NoMatch:
    """A BM25 text with no token in the registry (`retrieval.lexical`: it finds nothing): each distinct one counted
    in the study's data warnings (meta.json, the report; a text searched again, by another run or a batch's
    collect pass, once), the first also told on stderr."""

    KIND = "bm25_no_match"

    def __init__(self, warnings: Warnings, warn: Callable[[str], None]) -> None:
        self.warnings, self.warn = warnings, warn
        self.seen: set[str] = set()

    def __call__(self, text: str) -> None:
        if text in self.seen:
            return
        self.seen.add(text)
        shown = text if len(text) <= 120 else text[:117] + "..."
        if len(self.seen) == 1:
            self.warn(f"BM25: {shown!r} shares no token with the registry, so it retrieves nothing; every such text "
                      f"is counted under {self.KIND} in meta.json and the report's data warnings")
        self.warnings.add(self.KIND, shown)


def retriever_of(name: str, embedder: Embedder, index: VectorIndex, registry: Registry,
                 have: Mapping[str, Retriever], warn: Callable[[str], None] = SILENT.warn,
                 no_match: Callable[[str], None] | None = None) -> Retriever:
    """The retriever `name` (dense, bm25, hybrid) over this registry, reusing those of `have` (by name); the BM25
    index from the cache when there."""
    dense = have.get("dense") or Dense(embedder, index, searches_folder(embedder.cache_dir))
    if name == "dense":
        return dense
    lexical = have.get("bm25") or Lexical(load_index(registry.texts(), embedder.cache_dir, warn)[0], no_match)
    return lexical if name == "bm25" else Hybrid(dense, lexical)


def build_retriever(name: str, study: PreparedStudy, have: Mapping[str, Retriever]) -> Retriever:
    """A retriever an architecture asks for by name (`Context.search(..., retriever=)`), over the study's registry
    and index, reusing those the study has (`have`)."""
    return retriever_of(name, study.embedder, study.index, study.registry, have, study.warn, study.no_match)
