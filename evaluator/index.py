"""Index stage: exact inner-product search (faiss.IndexFlatIP) over L2-normalised vectors.

Every stage hands all its query vectors to one `search` call; FAISS then parallelises over queries
and uses BLAS, which per-query calls cannot.
"""

from __future__ import annotations

from collections.abc import Sequence

import faiss
import numpy as np


class VectorIndex:
    """An index over some rows of the registry's embedding matrix; results are registry rows."""

    def __init__(self, vectors: np.ndarray, rows: Sequence[int] | None = None) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
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
