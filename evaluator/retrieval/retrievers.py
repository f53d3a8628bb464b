"""Retrievers: texts in, each text's ranked registry rows with scores out (`Retriever`).

Every architecture searches through one of these, so each works with every retriever:
- `dense`: the texts embedded (the study's embedder and its cache) and searched exactly (`VectorIndex`,
  float64 re-scored; `SearchMemo` keeps every vector's result in `cache/searches/`). Score: cosine.
- `bm25`: Okapi BM25 over the registry's texts (`lexical`, bm25s). Score: BM25. A text with no token in the
  registry finds nothing (its row is `lexical.NO_HIT`), and is told to `on_no_match` (counted, warned once).
- `hybrid`: reciprocal-rank fusion of the two, score(t) = Σ_r 1 / (60 + rank_r(t)) over the dense and the
  BM25 list of the text (ranks from 1), each taken to its top `FUSION_DEPTH`; an API outside one list's
  top `FUSION_DEPTH` gets nothing from that list. Score: the RRF score (at most 2/61).
Ties go to the higher registry row for all three.

A text's scores are its retriever's own, so an architecture that merges several texts' lists (PtR's stubs)
merges the same way for every retriever: the best score any of its texts gives an API (retrieve.ptr_from_hits).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np

from evaluator.retrieval.embed import Embedder
from evaluator.retrieval.index import SearchMemo, VectorIndex
from evaluator.retrieval.lexical import NO_HIT, BM25Index

K = TypeVar("K", bound=Hashable)
RRF_K = 60  # the constant of Cormack et al. (2009), as ranx and the tool-retrieval papers use it
FUSION_DEPTH = 100  # each list fused to this depth (>= every k the study reports)

Hits = tuple[np.ndarray, np.ndarray]  # (scores float64, registry rows int64), each (n texts, k), best first


class Retriever(Protocol):
    """What an architecture searches with."""

    name: str  # one of config.RETRIEVER_CHOICES: it names the lists in records, meta and TREC runs

    def search(self, texts: Sequence[str], k: int) -> Hits: ...


class Dense:
    name = "dense"

    def __init__(self, embedder: Embedder, index: VectorIndex, memo_folder: Path | None = None) -> None:
        self.embedder, self.index, self.memo_folder = embedder, index, memo_folder
        self._memos: dict[int, SearchMemo] = {}

    def search(self, texts: Sequence[str], k: int) -> Hits:
        if texts:
            vecs = self.embedder.encode(list(texts), progress=False)
        else:
            vecs = np.zeros((0, self.index.vectors.shape[1]), np.float32)
        return self.search_vectors(vecs, k)

    def search_vectors(self, vecs: np.ndarray, k: int) -> Hits:
        if k not in self._memos:
            self._memos[k] = SearchMemo(self.index, k, self.memo_folder)
        return self._memos[k].search(vecs)


class Lexical:
    name = "bm25"

    def __init__(self, index: BM25Index, on_no_match: Callable[[str], None] | None = None) -> None:
        self.index, self.on_no_match = index, on_no_match

    def search(self, texts: Sequence[str], k: int) -> Hits:
        scores, rows = self.index.search(list(texts), k)
        if self.on_no_match is not None and rows.size:
            for i in np.flatnonzero(rows[:, 0] == NO_HIT):
                self.on_no_match(texts[int(i)])
        return scores, rows


class Hybrid:
    name = "hybrid"

    def __init__(self, dense: Retriever, lexical: Retriever, depth: int = FUSION_DEPTH, c: int = RRF_K) -> None:
        self.dense, self.lexical, self.depth, self.c = dense, lexical, depth, c

    def search(self, texts: Sequence[str], k: int) -> Hits:
        depth = max(self.depth, k)
        return rrf([self.dense.search(texts, depth)[1], self.lexical.search(texts, depth)[1]], k, self.c)


def rrf_scores(lists: Iterable[Iterable[K]], c: int = RRF_K) -> dict[K, float]:
    """Reciprocal-rank fusion's score of every item of the ranked lists (best first, no item twice in a list):
    score(t) = Σ_i 1 / (c + rank_i(t)), ranks from 1; in the order items are first seen. The one rule of the
    hybrid retriever and of the `fusion` architecture."""
    score: dict[K, float] = {}
    for ranked in lists:
        for rank, item in enumerate(ranked, 1):
            score[item] = score.get(item, 0.0) + 1.0 / (c + rank)
    return score


def rrf(lists: Sequence[np.ndarray], k: int, c: int = RRF_K) -> Hits:
    """Reciprocal-rank fusion of ranked row lists (each (n, depth_i), best first), per text (`rrf_scores`);
    the best k, ties to the higher row."""
    n = len(lists[0]) if lists else 0
    out_s = np.zeros((n, 0), np.float64)
    out_r = np.zeros((n, 0), np.int64)
    ranked_s, ranked_r = [], []
    for q in range(n):
        score = rrf_scores(([r for r in rows[q].tolist() if r != NO_HIT] for rows in lists), c)
        best = sorted(score.items(), key=lambda rs: (-rs[1], -rs[0]))[:k]
        ranked_r.append([r for r, _ in best])
        ranked_s.append([s for _, s in best])
    if n:  # rectangular: a shorter list (a text neither list found much for) padded with NO_HIT cells
        width = max(len(r) for r in ranked_r)
        out_r = np.array([r + [NO_HIT] * (width - len(r)) for r in ranked_r], np.int64).reshape(n, width)
        out_s = np.array([s + [-np.inf] * (width - len(s)) for s in ranked_s], np.float64).reshape(n, width)
    return out_s, out_r


# ---------------------------------------------------------------- sub-registries (the scaling study)


class SubSearch(Protocol):
    """Fixed texts searched over many sub-registries (registry rows); `index.SubsetSearch` is the dense one."""

    def search(self, rows: np.ndarray, k: int) -> Hits: ...

    def save(self) -> None: ...


class LexicalSubsets:
    """BM25 of fixed texts over sub-registries. The scoring stays the full registry's (its IDF and mean
    document length), as the dense scores do: a sub-registry's ranking is the full ranking with the other
    APIs left out, so the points of a scaling curve differ only in which APIs compete."""

    def __init__(self, index: BM25Index, texts: Sequence[str]) -> None:
        self.index, self.n = index, len(texts)
        self.products = index.products(list(texts))  # made once: each sub-registry only filters them

    def search(self, rows: np.ndarray, k: int) -> Hits:
        return self.index.top(self.products, self.n, k, rows)

    def save(self) -> None:
        pass


class HybridSubsets:
    """RRF of a dense and a BM25 `SubSearch` of the same texts, each to `FUSION_DEPTH` on the sub-registry."""

    def __init__(self, dense: SubSearch, lexical: SubSearch, depth: int = FUSION_DEPTH, c: int = RRF_K) -> None:
        self.dense, self.lexical, self.depth, self.c = dense, lexical, depth, c

    def search(self, rows: np.ndarray, k: int) -> Hits:
        depth = max(self.depth, k)
        return rrf([self.dense.search(rows, depth)[1], self.lexical.search(rows, depth)[1]], k, self.c)

    def save(self) -> None:
        self.dense.save()
