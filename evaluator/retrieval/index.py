"""Index stage: exact inner-product search over L2-normalised vectors.

Two engines give the same lists: `faiss.IndexFlatIP` (the CPU path; faiss is imported only when such
an index is built) and `TorchFlat`, the same exact top-k as a torch matrix product, chosen on a GPU
(`device` cuda) and on a CPU where faiss is not installed (`choose_engine`). Every stage hands all its
query vectors to one `search` call: FAISS then parallelises over queries and uses BLAS, which
per-query calls cannot; its OpenMP pool is sized to the CPUs this process may use and waits passively
(core/threads.py), set before faiss loads.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from evaluator.core import threads
from evaluator.core.cache_layout import CacheLayout
from evaluator.core.errors import EmbedderError
from evaluator.core.files import atomic_write
from evaluator.retrieval.backends import importable

threads.configure_env()

import numpy as np  # noqa: E402

ENGINES = ("auto", "faiss", "torch")
# What faiss returns for a slot beyond the index's size (k > ntotal): id -1 and -FLT_MAX.
_NO_ROW, _NO_SCORE = -1, float(np.finfo(np.float32).min)


class FlatIndex(Protocol):
    """An exact inner-product index over fixed vectors: faiss.IndexFlatIP's `ntotal` and `search`."""

    ntotal: int

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]: ...


def choose_engine(engine: str = "auto", device: str = "cpu") -> str:
    """The search engine that will run: `auto` is torch on a GPU, faiss on a CPU where it is installed
    (torch there otherwise). An EmbedderError names what is missing."""
    if engine not in ENGINES:
        raise EmbedderError(f"search engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if engine == "auto":
        return "faiss" if device == "cpu" and importable("faiss") else "torch"
    if engine == "faiss":
        if device != "cpu":
            raise EmbedderError(f"the faiss search runs on the CPU, not {device!r}; use the torch search there")
        if not importable("faiss"):
            raise EmbedderError("the faiss search needs faiss-cpu, which is not installed: pip install faiss-cpu "
                                "(or use the torch search)")
    return engine


def _faiss_flat(data: np.ndarray) -> FlatIndex:
    import faiss

    # In case faiss was loaded before this module set the environment: size its pool here.
    faiss.omp_set_num_threads(threads.available_cpus())
    index = faiss.IndexFlatIP(data.shape[1])
    index.add(data)
    return index


class TorchFlat:
    """`faiss.IndexFlatIP`'s search as a torch matrix product and top-k, on any torch device.

    Scores are float32 inner products (TF32 kept off, so a GPU computes them in full float32 like the
    CPU's BLAS; they may differ from FAISS's in the last bit, which `VectorIndex.exact_search`'s float64
    re-scoring settles). The rows kept and their order are FAISS's for exact ties too (`_faiss_keep`):
    FAISS scans rows in order into a heap of size k that admits a row only when it scores strictly above
    the heap's worst and orders equal scores by row, so of the rows tied at the k-th score it keeps the
    highest-numbered m (the slots left) among those found before the k-th row scoring at least that score,
    and lists ties higher row first. That is the heap FAISS uses for k < 100; for k >= 100 it switches to
    a reservoir whose tie choice is not reproduced here. Queries go in chunks that bound the score matrix
    (`_GPU_CELLS`, `_CPU_CELLS`), the registry stays on the device."""

    def __init__(self, data: np.ndarray, device: str = "cpu") -> None:
        import torch

        if device == "cpu":
            threads.configure_torch()
        self.device = torch.device(device)
        self.data = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32)).to(self.device)
        self.ntotal = len(data)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores float32, rows int64), each (n, k), best first; slots beyond `ntotal` are (-FLT_MAX, -1)."""
        import torch

        n, kk = len(queries), min(k, self.ntotal)
        scores = np.full((n, k), _NO_SCORE, np.float32)
        rows = np.full((n, k), _NO_ROW, np.int64)
        if n == 0 or kk == 0:
            return scores, rows
        step = max(1, (_CPU_CELLS if self.device.type == "cpu" else _GPU_CELLS) // self.ntotal)
        q_all = np.ascontiguousarray(queries, dtype=np.float32)
        precision = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")  # no TF32: the product in float32, as FAISS computes it
        try:
            with torch.inference_mode():
                for lo in range(0, n, step):
                    q = torch.from_numpy(q_all[lo : lo + step]).to(self.device)
                    s = q @ self.data.T
                    cols = _faiss_keep(s, kk).nonzero()[:, 1].reshape(len(q), kk)
                    scores[lo : lo + len(q), :kk] = s.gather(1, cols).cpu().numpy()
                    rows[lo : lo + len(q), :kk] = cols.cpu().numpy()
        finally:
            torch.set_float32_matmul_precision(precision)
        # FAISS's order: best score first, equal scores higher row first.
        order = np.lexsort((-rows[:, :kk], -scores[:, :kk]), axis=-1)
        scores[:, :kk] = np.take_along_axis(scores[:, :kk], order, axis=-1)
        rows[:, :kk] = np.take_along_axis(rows[:, :kk], order, axis=-1)
        return scores, rows


def _faiss_keep(s: Any, k: int) -> Any:
    """(n, rows) bool: the k rows of each score row that FAISS's heap keeps (see `TorchFlat`), k <= rows."""
    import torch

    kth = torch.topk(s, k, dim=1, sorted=False).values.min(dim=1, keepdim=True).values
    above = s > kth
    at_least = s >= kth
    first_k = at_least & (at_least.cumsum(1, dtype=torch.int32) <= k)  # the first k rows scoring >= kth, by row
    tied = first_k & ~above
    slots = k - above.sum(1, keepdim=True, dtype=torch.int32)
    from_end = tied.flip(1).cumsum(1, dtype=torch.int32).flip(1)  # tied rows at or after this one
    return above | (tied & (from_end <= slots))


class VectorIndex:
    """An index over some rows of the registry's embedding matrix; results are registry rows.

    `device`: where the embedder ran (`Embedder.device`); `engine`: `choose_engine`'s choice."""

    def __init__(self, vectors: np.ndarray, rows: Sequence[int] | None = None, *, device: str = "cpu",
                 engine: str = "auto") -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self.vectors = vectors  # the whole registry matrix: rows below index into it
        self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        data = np.ascontiguousarray(vectors if self.rows is None else vectors[self.rows])
        self.device = "cpu" if device.startswith("cpu") else device
        self.engine = choose_engine(engine, self.device)
        self.index: FlatIndex = _faiss_flat(data) if self.engine == "faiss" else TorchFlat(data, self.device)

    @property
    def description(self) -> str:
        """Which engine searches, for meta.json: e.g. 'faiss IndexFlatIP (cpu)', 'torch exact top-k (cuda)'."""
        what = "faiss IndexFlatIP" if self.engine == "faiss" else "torch exact top-k"
        return f"{what} ({self.device})"

    def __len__(self) -> int:
        return self.index.ntotal

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, registry rows), each (n, min(k, len)), best first; one call for all queries."""
        k = min(k, len(self))
        if len(queries) == 0:
            return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
        scores, idx = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        if self.rows is not None:
            idx = self.rows[idx]
        return scores, idx

    def exact_search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Like `search`, but scored in float64, so the result does not depend on which other
        queries shared the call (FAISS's batched BLAS path and its one-query path round
        differently, enough to swap near-tied APIs, and torch's product rounds differently again).
        Exact ties (the registry has APIs whose texts differ only in case, which an uncased model
        embeds identically) go to the higher row, as FAISS orders them."""
        k = min(k, len(self))
        _, cand = self.search(queries, min(k + _MARGIN, len(self)))
        return rescore(self.vectors, queries, cand, k)


def rescore(vectors: np.ndarray, queries: np.ndarray, cand: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best k of each query's candidate registry rows `cand` (n, c), scored in float64; exact
    ties go to the higher row. (scores, rows), each (n, k)."""
    scores = np.empty((len(queries), k), np.float64)
    rows = np.empty((len(queries), k), np.int64)
    for lo in range(0, len(queries), _CHUNK):
        c = cand[lo : lo + _CHUNK]
        q = queries[lo : lo + _CHUNK].astype(np.float64, copy=False)
        s = np.einsum("qd,qkd->qk", q, vectors[c].astype(np.float64, copy=False))
        order = np.lexsort((-c, -s), axis=-1)[:, :k]
        scores[lo : lo + _CHUNK] = np.take_along_axis(s, order, axis=-1)
        rows[lo : lo + _CHUNK] = np.take_along_axis(c, order, axis=-1)
    return scores, rows


class SubsetSearch:
    """`exact_search` of fixed queries over many subsets of the registry's rows, from one pass.

    A subset's float32 ranking is the full registry's ranking with the other rows left out, so each
    query's full ranking is computed once (one matrix product, kept to its best rows: every row
    scoring at least a threshold set so that about `depth` rows pass) and a subset's FAISS
    candidates (its best k + margin rows in float32) are the first of those rows that belong to it;
    they are then re-scored in float64 exactly as `exact_search` does. A query whose prefix holds
    too few rows of a subset (a small subset far from it) is searched over that subset directly.
    Identical query vectors (a stub repeated across runs) are searched once. The scaling study
    searches ~100 sub-registries this way instead of building an index and searching for each.

    With `folder`, every result is also kept on disk under a digest of the matrix, the queries and
    the subset (`<folder>/subsets-<digest>.npz`, written by `save`), and the full pass is made only
    when a search is not there: a rerun of an unchanged scaling study reads its results instead of
    computing them (bench/README.md, "retrieval/index.py").
    """

    def __init__(self, vectors: np.ndarray, queries: np.ndarray, k: int, smallest: int,
                 vectors64: Callable[[], np.ndarray] | None = None, folder: Path | None = None,
                 matrix_digest: str | None = None) -> None:
        """`smallest`: the fewest rows a searched subset will have. The prefix is twice as deep as
        the rank at which such a subset holds its k + margin candidates on average (a query still
        short of them is searched directly). `vectors64`: gives `vectors` in float64, when the
        caller has it (the scaling study shares one between its subsets, made on first use). `matrix_digest`:
        `digest(vectors)`, when the caller already has it."""
        self.vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self._queries_in = np.ascontiguousarray(queries, dtype=np.float32).reshape(len(queries), self.vectors.shape[1])
        self.n = len(queries)
        self._k, self._smallest, self._vectors64 = k, smallest, vectors64
        self._built = False
        self._memo: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._new = False
        self._file: Path | None = None
        if folder is not None:
            h = hashlib.blake2b(digest_size=16)
            h.update(f"subsets|{matrix_digest or digest(self.vectors)}|{k}|{smallest}|{_MARGIN}|".encode())
            h.update(self._queries_in.view(np.uint8).reshape(-1).data)
            self._file = folder / f"subsets-{h.hexdigest()}.npz"
            self._memo = _read_memo(self._file)

    def _build(self) -> None:
        """The full pass: unique queries, their float64 copies and ranked prefixes."""
        if self._built:
            return
        self._built = True
        k, smallest, vectors64, queries = self._k, self._smallest, self._vectors64, self._queries_in
        uniq, self.inverse = np.unique(queries, axis=0, return_inverse=True)
        self.queries = np.ascontiguousarray(uniq)
        self.inverse = self.inverse.reshape(-1)
        # float64 copies made once: the re-scoring of every subset reads them
        self.vectors64 = self.vectors.astype(np.float64) if vectors64 is None else vectors64()
        self.queries64 = self.queries.astype(np.float64)
        self.depth = self._depth(k, max(smallest, 1))
        blocks = [self._prefix(self.queries[lo : lo + _BLOCK]) for lo in range(0, len(self.queries), _BLOCK)]
        width = max([b.shape[1] for b in blocks], default=0)
        # rows beyond a query's prefix hold `len(vectors)`, a row no subset contains
        self.prefix = np.full((len(self.queries), width), len(self.vectors), np.int64)
        for lo, b in zip(range(0, len(self.queries), _BLOCK), blocks, strict=True):
            self.prefix[lo : lo + len(b), : b.shape[1]] = b

    def _depth(self, k: int, size: int) -> int:
        return min(max(math.ceil(2 * (k + _MARGIN) * len(self.vectors) / size), 1), len(self.vectors))

    def _prefix(self, q: np.ndarray) -> np.ndarray:
        """Per query, every row scoring at least its threshold, best first (ties: the lower row
        first, as FAISS keeps them). The threshold is the score of rank ~1.25 x depth estimated
        on every 16th row: a selection pass over the registry instead of a partial sort."""
        s = q @ self.vectors.T
        n = s.shape[1]
        step = 16 if n >= 16 * 64 else 1
        sample = s[:, ::step]
        kth = min(max(math.ceil(1.25 * self.depth / step), 1), sample.shape[1]) - 1
        threshold = np.partition(sample, sample.shape[1] - 1 - kth, axis=1)[:, sample.shape[1] - 1 - kth]
        qi, cols = np.nonzero(s >= threshold[:, None])  # cols ascending within a query
        counts = np.bincount(qi, minlength=len(q))
        pos = np.arange(len(qi)) - np.repeat(np.cumsum(counts) - counts, counts)
        width = int(counts.max(initial=0))
        rows = np.full((len(q), width), n, np.int64)
        scores = np.full((len(q), width), -np.inf, np.float32)
        rows[qi, pos] = cols
        scores[qi, pos] = s[qi, cols]
        order = np.argsort(-scores, axis=1, kind="stable")
        return np.take_along_axis(rows, order, axis=1)

    def search(self, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """`VectorIndex(vectors, rows).exact_search(queries, k)`: (scores, registry rows), (n, min(k, len(rows)))."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        key = hashlib.blake2b(rows.view(np.uint8).data, digest_size=16, person=str(k).encode()[:16]).hexdigest()
        if key not in self._memo:
            self._build()
            self._memo[key] = self._search(rows, k)
            self._new = True
        return self._memo[key]

    def save(self) -> None:
        """Writes the results kept (with `folder`) when a search added one; a cache that cannot be
        written only costs the next run the pass."""
        if self._file is None or not self._new:
            return
        keys = sorted(self._memo)
        arrays = {f"s{i}": self._memo[key][0] for i, key in enumerate(keys)}
        arrays |= {f"r{i}": self._memo[key][1] for i, key in enumerate(keys)}
        _write_npz(self._file, keys=np.array(keys), **arrays)
        self._new = False

    def _search(self, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.queries)
        k = min(k, len(rows))
        kc = min(k + _MARGIN, len(rows))
        if n == 0 or k == 0:
            return np.zeros((self.n, k), np.float64), np.zeros((self.n, k), np.int64)
        member = np.zeros(len(self.vectors) + 1, dtype=bool)  # + the padding row, never a member
        member[rows] = True
        prefix = self.prefix[:, : self._depth(k, len(rows))]  # a larger subset needs less of it
        hit = member[prefix]
        taken = hit & (np.cumsum(hit, axis=1, dtype=np.int32) <= kc)
        enough = np.count_nonzero(taken, axis=1) == kc
        cand = np.empty((n, kc), np.int64)
        cand[enough] = prefix[enough][taken[enough]].reshape(-1, kc)
        short = np.flatnonzero(~enough)
        if len(short):
            sub = np.asarray(rows, dtype=np.int64)
            for lo in range(0, len(short), _BLOCK):
                qi = short[lo : lo + _BLOCK]
                s = self.queries[qi] @ self.vectors[sub].T
                part = np.argpartition(-s, kc - 1, axis=1)[:, :kc] if kc < len(sub) else \
                    np.broadcast_to(np.arange(len(sub)), s.shape)
                cand[qi] = sub[part]
        scores, best = rescore(self.vectors64, self.queries64, cand, k)
        return scores[self.inverse], best[self.inverse]


def searches_folder(cache: Path | None) -> Path | None:
    """Where a cache folder keeps searches between runs (`SearchMemo`'s and `SubsetSearch`'s)."""
    return CacheLayout(cache).searches if cache is not None else None


def digest(vectors: np.ndarray) -> str:
    """A key for a matrix's content (blake2b of its bytes: ~0.1 s for the 47k registry's)."""
    return hashlib.blake2b(np.ascontiguousarray(vectors).view(np.uint8).reshape(-1).data, digest_size=16).hexdigest()


def _read_memo(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """`SubsetSearch`'s kept results; an unreadable or foreign file is nothing kept (searched again)."""
    if not path.is_file():
        return {}
    try:
        with np.load(path) as z:
            keys = [str(k) for k in z["keys"]]
            out = {key: (z[f"s{i}"], z[f"r{i}"]) for i, key in enumerate(keys)}
    except Exception:  # noqa: BLE001 - zipfile, numpy and KeyError alike: the pass is made again
        return {}
    if any(s.shape != r.shape or s.ndim != 2 for s, r in out.values()):
        return {}
    return out


def _write_npz(path: Path, **arrays: np.ndarray) -> None:
    """Written atomically; an unwritable folder is silently skipped (the next run searches again)."""
    with contextlib.suppress(OSError):
        atomic_write(path, lambda fh: np.savez(fh, allow_pickle=False, **arrays))  # numbers and strings only


class SearchMemo:
    """`VectorIndex.exact_search(queries, k)`, each query vector searched once: results are kept by the
    vector's bytes, in memory and (with `folder`) on disk under a digest of the index's matrix, so
    a rerun's stubs, all seen before, are not searched again. `exact_search` does not depend on which
    queries share a call, so a remembered row is the row a new search would give.

    On disk: `<folder>/<matrix digest>-k<k>/shard-*.npz` (keys, scores, rows), written to a temporary
    name and renamed; an unreadable shard is skipped (its queries are searched again)."""

    def __init__(self, index: VectorIndex, k: int, folder: Path | None = None) -> None:
        self.index = index
        self.k = min(k, len(index))
        self.found: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
        self.folder: Path | None = None
        if folder is not None:
            name = digest(index.vectors)
            if index.rows is not None:
                name = hashlib.blake2b(f"{name}|".encode() + index.rows.tobytes(), digest_size=16).hexdigest()
            self.folder = folder / f"{name}-k{self.k}"
            self._read()

    def _read(self) -> None:
        assert self.folder is not None
        for shard in sorted(self.folder.glob("shard-*.npz")) if self.folder.is_dir() else []:
            try:
                with np.load(shard) as z:
                    keys, scores, rows = z["keys"], z["scores"], z["rows"]
                if scores.shape != rows.shape or scores.shape != (len(keys), self.k):
                    continue
            except Exception:  # noqa: BLE001 - a truncated or foreign file: searched again
                continue
            for key, sc, r in zip(keys, scores, rows, strict=True):
                self.found[bytes(key).ljust(16, b"\0")] = (sc, r)

    def search(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(scores, registry rows), each (n, k), as `VectorIndex.exact_search(queries, k)` returns them."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        keys = [hashlib.blake2b(q.tobytes(), digest_size=16).digest() for q in queries]
        todo = list(dict.fromkeys(key for key in keys if key not in self.found))
        if todo:
            first = {key: i for i, key in reversed(list(enumerate(keys)))}
            scores, rows = self.index.exact_search(queries[[first[key] for key in todo]], self.k)
            self.found.update(zip(todo, zip(scores, rows, strict=True), strict=True))
            self._write(todo, scores, rows)
        if not keys:
            return np.zeros((0, self.k), np.float64), np.zeros((0, self.k), np.int64)
        return (np.stack([self.found[key][0] for key in keys]), np.stack([self.found[key][1] for key in keys]))

    def _write(self, keys: list[bytes], scores: np.ndarray, rows: np.ndarray) -> None:
        """One shard for the new results; a cache that cannot be written only costs a later search."""
        if self.folder is not None:
            _write_npz(self.folder / f"shard-{uuid.uuid4().hex}.npz", keys=np.array(keys, dtype="S16"),
                       scores=scores, rows=rows)


_MARGIN = 8  # extra FAISS candidates re-scored exactly, so boundary near-ties are settled in float64
_CHUNK = 1024  # queries re-scored at once: bounds the (chunk, k, d) float64 buffer
_BLOCK = 256  # queries per float32 matrix product: bounds the (block, registry) buffer
# Score cells per chunk of `TorchFlat.search`, ~16 bytes a cell with its masks: 1 GiB on a GPU, 64 MiB on a CPU.
_GPU_CELLS, _CPU_CELLS = 1 << 26, 1 << 22
