"""BM25 stage: an Okapi BM25 index of the registry's texts (`bm25s`), cached on disk, searched exactly.

Text of an API: the text the dense embedder sees (`Registry.texts()`: "{tool_name}/{api_name}: {description}").
Tokenisation (`TOKENIZER`, part of the cache key): identifiers are split first, since API and stub names are
written `get_player_transfers`, `getPlayerTransfers` or `Get Player Transfers` alike (`_` becomes a space and a
camelCase boundary a space); then bm25s's own tokenizer (lower case, tokens of two or more word characters,
the scikit-learn pattern) with bm25s's English stop-word list and no stemmer. Scoring: bm25s's defaults
(method "lucene", k1 = 1.5, b = 0.75). The index is bm25s's: per (document, term) the term's BM25 weight, as a
sparse matrix; a query's score of a document is the sum of the weights of the query's tokens (a token that
occurs twice counts twice, as in `bm25s.BM25.get_scores`).

Search scores every document in float64 (one sparse product for a block of queries) and ranks by score,
ties to the higher registry row (as the dense index orders them); a query that matches fewer than k documents
is padded with score-0 documents in the same order, so every list is k long, like the dense one (bm25s's own
`retrieve` does the same). A query that matches no document at all (none of its tokens is in the registry, or
in the sub-registry searched) finds nothing: its row of the result is `NO_HIT` (row -1, score -inf) throughout,
never the registry's first or last rows scored 0; `ranking.from_hits` and every merge leave those cells out.

Cache: `<cache>/bm25/<digest>.npz` (core.cache_layout), the digest over the texts (in order), the tokenizer, the scoring
parameters and bm25s's version. The file carries a checksum of its arrays; one that is unreadable or fails
it is rebuilt (with one warning), never trusted.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from evaluator.core.cache_layout import CacheLayout
from evaluator.core.errors import UserError
from evaluator.core.files import atomic_write

if TYPE_CHECKING:
    import scipy.sparse as sp

TOKENIZER = "split-identifiers(_ camelCase) + bm25s.tokenize(lower, stopwords=en, stemmer=none)"
METHOD, K1, B = "lucene", 1.5, 0.75
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_BLOCK = 512  # queries per sparse product: bounds the (block, registry) result
NO_HIT = -1  # the row of a cell of a search result that holds no document (a text that matched nothing)


class LexicalError(UserError):
    """bm25s is missing or the index cannot be built; the message says what to do."""


def _bm25s():
    """bm25s, imported when a BM25 index is first needed: a dense run never pays its import (0.5 s CPU)."""
    try:
        import bm25s
    except ImportError:
        raise LexicalError("--retriever bm25/hybrid needs the bm25s package: pip install bm25s "
                           "(bash .ci/setup installs it)") from None
    return bm25s


def _sp():
    """scipy.sparse, imported with the first index: a dense run's start-up never pays for it."""
    import scipy.sparse

    return scipy.sparse


def split_identifiers(text: str) -> str:
    return _CAMEL.sub(" ", text).replace("_", " ")


def tokenize(texts: Sequence[str]) -> list[list[str]]:
    """The tokens of each text, as the index and its queries see them (`TOKENIZER`)."""
    if not texts:
        return []
    bm25s = _bm25s()
    out = bm25s.tokenize([split_identifiers(t) for t in texts], lower=True, stopwords="en", stemmer=None,
                         return_ids=False, show_progress=False)
    return [list(x) for x in out]


def settings_key() -> str:
    return f"{TOKENIZER}|{METHOD}|k1={K1}|b={B}|bm25s={_bm25s().__version__}"


def content_digest(texts: Sequence[str]) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{settings_key()}|{len(texts)}|".encode())
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


class BM25Index:
    """BM25 over the registry's texts; `search` returns registry rows, as `VectorIndex` does."""

    def __init__(self, weights: sp.csr_matrix, vocab: dict[str, int]) -> None:
        self.weights = weights  # (vocab, documents), float64: term -> its weight in each document
        self.vocab = vocab

    def __len__(self) -> int:
        return self.weights.shape[1]

    @classmethod
    def build(cls, texts: Sequence[str]) -> BM25Index:
        bm25s = _bm25s()
        model = bm25s.BM25(method=METHOD, k1=K1, b=B)
        # Texts without one token (emoji only): bm25s divides by a mean length of 0 and numpy warns on stderr; the
        # weights it builds for them are no weights at all (no token), so the warning says nothing to the user.
        with np.errstate(divide="ignore", invalid="ignore"):
            scores, vocab = model.build_index_from_tokens(tokenize(texts), show_progress=False)
        # bm25s's (documents x vocab) CSC arrays, read as the (vocab x documents) CSR matrix they also are
        m = _sp().csr_matrix((scores["data"].astype(np.float64), scores["indices"], scores["indptr"]),
                          shape=(len(vocab), scores["num_docs"]))
        return cls(m, dict(vocab))

    def query_matrix(self, texts: Sequence[str]) -> sp.csr_matrix:
        rows, cols = [], []
        for i, toks in enumerate(tokenize(texts)):
            ids = [self.vocab[t] for t in toks if t in self.vocab]
            rows += [i] * len(ids)
            cols += ids
        data = np.ones(len(rows), np.float64)
        return _sp().csr_matrix((data, (rows, cols)), shape=(len(texts), len(self.vocab)))  # duplicates summed

    def products(self, texts: Sequence[str]) -> list[sp.csr_matrix]:
        """Every text's score of every document (sparse: only documents sharing a token), in blocks."""
        return [(self.query_matrix(texts[lo : lo + _BLOCK]) @ self.weights).tocsr()
                for lo in range(0, len(texts), _BLOCK)]

    def search(self, texts: Sequence[str], k: int, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores, registry rows), each (n, min(k, |rows|)), best first. `rows`: search only these registry
        rows (a sub-registry; the statistics stay the full registry's)."""
        return self.top(self.products(texts), len(texts), k, rows)

    def top(self, products: Sequence[sp.csr_matrix], n: int, k: int, rows: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray]:
        """`search` from `products(texts)` (n texts): a caller that searches many sub-registries makes them once."""
        n_docs = len(self)
        member = None
        if rows is not None:
            member = np.zeros(n_docs, dtype=bool)
            member[rows] = True
        size = n_docs if member is None else int(member.sum())
        k = min(k, size)
        out_s = np.zeros((n, k), np.float64)
        out_r = np.zeros((n, k), np.int64)
        # score-0 padding: the highest rows first (ties to the higher row)
        pool = np.arange(n_docs - 1, -1, -1) if member is None else np.flatnonzero(member)[::-1]
        i = 0
        for prod in products:
            for j in range(prod.shape[0]):
                a, b = prod.indptr[j], prod.indptr[j + 1]
                cols, vals = prod.indices[a:b].astype(np.int64), prod.data[a:b]
                keep = vals > 0 if member is None else (vals > 0) & member[cols]
                cols, vals = cols[keep], vals[keep]
                if not len(cols):  # no token of the text in the (sub-)registry: nothing found, no padding
                    out_s[i], out_r[i] = -np.inf, NO_HIT
                    i += 1
                    continue
                order = np.lexsort((-cols, -vals))[:k]
                cols, vals = cols[order], vals[order]
                if len(cols) < k:
                    cand = pool[: k + len(cols)]
                    pad = cand[~np.isin(cand, cols)][: k - len(cols)]
                    cols = np.concatenate([cols, pad])
                    vals = np.concatenate([vals, np.zeros(len(pad))])
                out_s[i], out_r[i] = vals, cols
                i += 1
        return out_s, out_r

    # ------------------------------------------------------------ the cache file

    def _arrays(self) -> dict[str, np.ndarray]:
        vocab = sorted(self.vocab, key=self.vocab.__getitem__)
        w = self.weights
        return {"data": w.data.astype(np.float64), "indices": w.indices.astype(np.int32),
                "indptr": w.indptr.astype(np.int64), "shape": np.array(w.shape, np.int64),
                "vocab": np.array("\n".join(vocab))}

    def save(self, path: Path) -> None:
        arrays = self._arrays()
        arrays["checksum"] = np.array(_checksum(arrays))
        atomic_write(path, lambda fh: np.savez(fh, allow_pickle=False, **arrays), durable=True)

    @classmethod
    def read(cls, path: Path) -> BM25Index:
        """The index in `path`; ValueError (or an OSError, a zip error) when it is damaged."""
        with np.load(path) as z:
            arrays = {name: z[name] for name in ("data", "indices", "indptr", "shape", "vocab")}
            if "checksum" not in z.files or str(z["checksum"]) != _checksum(arrays):
                raise ValueError("checksum mismatch")
        shape = tuple(int(x) for x in arrays["shape"])
        vocab = str(arrays["vocab"]).split("\n") if shape[0] else []
        if len(vocab) != shape[0] or len(arrays["indptr"]) != shape[0] + 1:
            raise ValueError("wrong shape")
        m = _sp().csr_matrix((arrays["data"], arrays["indices"], arrays["indptr"]), shape=shape)
        return cls(m, {t: i for i, t in enumerate(vocab)})


def _checksum(arrays: dict[str, np.ndarray]) -> str:
    crc = 0
    for name in ("data", "indices", "indptr", "shape", "vocab"):
        a = np.ascontiguousarray(arrays[name])
        crc = zlib.crc32(f"{name}:{a.dtype.str}:{a.shape}:".encode(), crc)
        crc = zlib.crc32(a.tobytes() if a.dtype.kind == "U" else a.reshape(-1).view(np.uint8).data, crc)
    return f"{crc:08x}"


def load_index(texts: Sequence[str], cache_dir: Path | None, warn: Callable[[str], None] = lambda _m: None
               ) -> tuple[BM25Index, bool]:
    """The registry's BM25 index from `<cache_dir>/bm25/` when there, else built (and kept there).
    (index, built): built is False when it came from the cache."""
    path = CacheLayout(cache_dir).bm25 / f"{content_digest(texts)}.npz" if cache_dir is not None else None
    if path is not None and path.is_file():
        try:
            idx = BM25Index.read(path)
            if len(idx) == len(texts):
                return idx, False
            why = f"{len(idx)} documents, not {len(texts)}"
        except Exception as e:  # noqa: BLE001 - a truncated zip, flipped bytes, a foreign file alike
            why = str(e) if isinstance(e, ValueError) else f"unreadable ({type(e).__name__})"
        warn(f"damaged BM25 index cache file {path} ({why}); rebuilt")
        with contextlib.suppress(OSError):
            path.rename(path.with_name(path.name + ".damaged"))
    idx = BM25Index.build(texts)
    if path is not None:
        with contextlib.suppress(OSError):  # a cache that cannot be written only costs the next run the build
            idx.save(path)
    return idx, True
