"""Index stage: exact inner-product search (faiss.IndexFlatIP) over L2-normalised vectors.

Every stage hands all its query vectors to one `search` call; FAISS then parallelises over queries
and uses BLAS, which per-query calls cannot. Its OpenMP pool is sized to the CPUs this process may
use and waits passively (threads.py), set before faiss loads.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import threads

threads.configure_env()

import faiss  # noqa: E402
import numpy as np  # noqa: E402


class VectorIndex:
    """An index over some rows of the registry's embedding matrix; results are registry rows."""

    def __init__(self, vectors: np.ndarray, rows: Sequence[int] | None = None) -> None:
        threads.configure_faiss()  # in case faiss was loaded before this module set the environment
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self.vectors = vectors  # the whole registry matrix: rows below index into it
        self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        data = vectors if self.rows is None else vectors[self.rows]
        self.index = faiss.IndexFlatIP(vectors.shape[1])
        self.index.add(np.ascontiguousarray(data))

    def __len__(self) -> int:
        return self.index.ntotal

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, registry rows), each (n, min(k, len)), best first; one FAISS call for all queries."""
        k = min(k, len(self))
        if len(queries) == 0:
            return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
        scores, idx = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        if self.rows is not None:
            idx = self.rows[idx]
        return scores, idx

    def exact_search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Like `search`, but scored in float64, so the result does not depend on which other
        queries shared the FAISS call (its batched BLAS path and its one-query path round
        differently, enough to swap near-tied APIs). Exact ties (the registry has APIs whose texts
        differ only in case, which an uncased model embeds identically) go to the higher row, as
        FAISS itself orders them."""
        k = min(k, len(self))
        _, cand = self.search(queries, min(k + _MARGIN, len(self)))
        scores = np.empty((len(queries), k), np.float64)
        rows = np.empty((len(queries), k), np.int64)
        for lo in range(0, len(queries), _CHUNK):
            c = cand[lo : lo + _CHUNK]
            q = queries[lo : lo + _CHUNK].astype(np.float64)
            s = np.einsum("qd,qkd->qk", q, self.vectors[c].astype(np.float64))
            order = np.lexsort((-c, -s), axis=-1)[:, :k]
            scores[lo : lo + _CHUNK] = np.take_along_axis(s, order, axis=-1)
            rows[lo : lo + _CHUNK] = np.take_along_axis(c, order, axis=-1)
        return scores, rows


_MARGIN = 8  # extra FAISS candidates re-scored exactly, so boundary near-ties are settled in float64
_CHUNK = 1024  # queries re-scored at once: bounds the (chunk, k, d) float64 buffer
