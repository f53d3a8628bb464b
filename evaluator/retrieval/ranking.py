"""Retrieval for both architectures, given embedded queries or stubs and an index.

RtP: the query's top-k. PtR: every stub searched to top-k, the union deduplicated and re-ranked by
the best similarity any stub gives an API, cut to k: R_PtR(q) = TopK_t max_s sim(s, d_t).
Searching every stub to K_MAX makes the PtR ranking a prefix list: its first k entries are exactly
R_PtR at budget k for every k <= K_MAX, so one search serves the whole k-ablation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from evaluator.retrieval.index import VectorIndex
from evaluator.retrieval.lexical import NO_HIT


@dataclass
class Retrieved:
    rows: list[int]  # registry rows, best first
    scores: list[float]
    # PtR only: per-stub hits and the size of the deduplicated union at each budget k.
    stub_rows: list[list[int]] = field(default_factory=list)
    stub_scores: list[list[float]] = field(default_factory=list)
    width: dict[int, int] = field(default_factory=dict)


def rtp(index: VectorIndex, query_vecs: np.ndarray, k_max: int) -> list[Retrieved]:
    return from_hits(index.exact_search(query_vecs, k_max))


def from_hits(hits: tuple[np.ndarray, np.ndarray]) -> list[Retrieved]:
    """One `Retrieved` per searched text, from a retriever's (scores, rows); cells that hold no document
    (`lexical.NO_HIT`: BM25 found nothing for the text) are left out."""
    scores, rows = hits
    out = []
    for s, r in zip(scores, rows, strict=True):
        found = r != NO_HIT
        out.append(Retrieved(r.tolist(), s.tolist()) if found.all() else Retrieved(r[found].tolist(), s[found].tolist()))
    return out


def ptr(
    index: VectorIndex,
    stub_vecs: np.ndarray,
    owners: Sequence[int],
    n_queries: int,
    k_max: int,
    ks: Sequence[int],
) -> list[Retrieved]:
    """`owners[j]` is the query (0..n_queries-1) that stub j belongs to; a query with no stub gets
    an empty result."""
    scores, rows = index.exact_search(stub_vecs, k_max)
    return ptr_from_hits(scores, rows, owners, n_queries, k_max, ks)


def ptr_from_hits(
    scores: np.ndarray, rows: np.ndarray, owners: Sequence[int], n_queries: int, k_max: int, ks: Sequence[int],
) -> list[Retrieved]:
    """PtR's union and re-ranking, from every stub's own top-k_max (scores, rows), best first."""
    by_query: list[list[int]] = [[] for _ in range(n_queries)]
    for j, q in enumerate(owners):
        by_query[q].append(j)
    out: list[Retrieved] = []
    for stubs in by_query:
        best: dict[int, float] = {}
        hits = [from_hits((scores[j : j + 1], rows[j : j + 1]))[0] for j in stubs]  # NO_HIT cells left out
        for h in hits:
            for r, s in zip(h.rows, h.scores, strict=True):
                if s > best.get(r, -np.inf):
                    best[r] = s
        # Ties go to the higher registry row, as in `VectorIndex.exact_search` and FAISS.
        ranked = sorted(best.items(), key=lambda rs: (-rs[1], -rs[0]))[:k_max]
        width = {k: len({r for h in hits for r in h.rows[:k]}) for k in ks}
        out.append(
            Retrieved(
                rows=[r for r, _ in ranked],
                scores=[s for _, s in ranked],
                stub_rows=[h.rows for h in hits],
                stub_scores=[h.scores for h in hits],
                width=width,
            )
        )
    return out


def ptr_rows(scores: np.ndarray, rows: np.ndarray, owners: Sequence[int], n_queries: int, k: int) -> list[list[int]]:
    """`[r.rows for r in ptr_from_hits(scores, rows, owners, n_queries, k, ...)]` in a few array
    operations: each query's union of stub hits at its best score, ranked by score (ties to the
    higher row), cut to k. For the scaling study, which ranks ~30k queries per sub-registry."""
    if len(owners) == 0 or rows.shape[1] == 0:
        return [[] for _ in range(n_queries)]
    o = np.repeat(np.asarray(owners, dtype=np.int64), rows.shape[1])
    r, s = rows.ravel(), scores.ravel()
    found = r != NO_HIT  # a BM25 stub that matched nothing adds nothing
    o, r, s = o[found], r[found], s[found]
    order = np.lexsort((-s, r, o))  # per (query, row): its best score first
    o, r, s = o[order], r[order], s[order]
    best = np.ones(len(o), dtype=bool)
    best[1:] = (o[1:] != o[:-1]) | (r[1:] != r[:-1])
    o, r, s = o[best], r[best], s[best]
    order = np.lexsort((-r, -s, o))
    o, r = o[order], r[order]
    rank = np.arange(len(o)) - np.searchsorted(o, o)  # position within the query's ranking
    keep = rank < k
    o, r = o[keep], r[keep]
    counts = np.bincount(o, minlength=n_queries)
    return [part.tolist() for part in np.split(r, np.cumsum(counts)[:-1])]
