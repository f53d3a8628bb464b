"""CPU runtimes for the embedder besides torch: ONNX Runtime and OpenVINO.

The sentence-transformers pipeline (transformer, pooling, normalisation) is exported once to ONNX
with torch's own exporter and kept in the cache folder under a key of model, model files and
options (`exports/<model>/<kind>-<hash>/`), so later runs load it in about a second. From it:
- `onnx` fp32: ONNX Runtime with all graph optimisations (operator fusion) at session creation;
- `onnx` int8: ONNX Runtime's dynamic quantisation (int8 weights, per channel; activations
  quantised at run time);
- `openvino` fp32 / bf16: the export converted to OpenVINO IR (weights kept in fp32) and compiled
  for the CPU with that inference precision (bf16 runs the matrix products in bfloat16 with fp32
  accumulation where the CPU has the instructions, and stays fp32 where it has not).

sentence-transformers' own `backend="onnx"/"openvino"` needs `optimum-onnx` / `optimum-intel`,
whose current releases pin transformers 4.x (or an older 5.x plus torchvision), which the installed
sentence-transformers 6 cannot use; the exporter here needs only torch, onnx and the runtime.

Tokenisation stays the model's own: the export keeps the model's fast tokenizer as `tokenizers`
runs it (`tokenizer.json`, configured as sentence-transformers calls it: truncation at the model's
max_seq_length, no padding) once it gave exactly sentence-transformers' token ids on probe texts, so
every backend sees the ids torch sees and a study whose export exists never imports torch (loading
torch and sentence-transformers is the slow start of every run that embeds a new stub: bench/README.md,
"retrieval/backends.py"). A model whose tokenizer fails the probe keeps tokenising through
sentence-transformers.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import logging
import multiprocessing
import os
import shutil
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock
from tokenizers import Tokenizer

from evaluator.core.cache_layout import CacheLayout
from evaluator.core.errors import EmbedderError
from evaluator.core.files import atomic_folder

EXPORT_VERSION = 2  # bump when the export procedure changes: old exports are then ignored (2: tokenizer kept)
OPSET = 17
BACKENDS = ("torch", "onnx", "openvino")
# Precisions each runtime offers on a CPU (torch's fp16 is for CUDA).
PRECISIONS = {"torch": ("fp32", "bf16", "fp16"), "onnx": ("fp32", "int8"), "openvino": ("fp32", "bf16")}
_PACKAGES = {"onnx": ("onnxruntime", "onnx"), "openvino": ("openvino", "onnx")}

Runner = Callable[[dict[str, np.ndarray]], np.ndarray]
TOKENIZER_FILE = "tokenizer.json"
INFO_FILE = "embedder.json"  # input names, pad id, dimension, max_seq_length of the exported pipeline
# Texts the kept tokenizer must tokenise exactly as sentence-transformers does: empty, blank, padded
# with spaces, accents and case, control characters, an emoji, and one past max_seq_length (truncation).
PROBES = ["", "   ", "  Weather/current: the current weather  ", "Émile's café: NAÏVE über-Straße",
          "tab\tnew\nline", "emoji 😀 and 中文", "x", "word " * 600]


def importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ValueError, ImportError):  # a module set to None in sys.modules counts as absent
        return False


def missing_package(backend: str) -> str | None:
    """One line naming what to install for `backend`, or None when it can run here."""
    missing = [p for p in _PACKAGES.get(backend, ()) if not importable(p)]
    if not missing:
        return None
    return (
        f"the {backend} embedding backend needs {' and '.join(missing)}, which is not installed: "
        f"pip install -e '.[{backend}]' (or use --backend torch)"
    )


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _fingerprint(load_path: str, kind: str) -> str:
    """Model files (name, size, mtime) and the export options: a changed model re-exports. The
    exporter's torch version is read from its metadata: importing torch costs seconds."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{EXPORT_VERSION}|{OPSET}|{kind}|torch {_version('torch')}|{load_path}".encode())
    root = Path(load_path)
    if root.is_dir():
        for f in sorted(root.rglob("*")):
            if f.is_file() and not f.name.startswith("."):
                st = f.stat()
                h.update(f"{f.relative_to(root)}|{st.st_size}|{int(st.st_mtime)}".encode())
    return h.hexdigest()


def _export_onnx(st, out: Path, input_names: list[str]) -> None:
    import torch

    class Pipeline(torch.nn.Module):
        def __init__(self, model) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            return self.model(dict(zip(input_names, tensors, strict=True)))["sentence_embedding"]

    feats = features(st, ["an example text to trace the graph", "a second, longer example text for the batch"])
    args = tuple(feats[n] for n in input_names)
    axes = {n: {0: "batch", 1: "tokens"} for n in input_names}
    axes["embedding"] = {0: "batch"}
    with warnings.catch_warnings(), torch.no_grad():
        # The tracer warns about Python branches on shapes; the export is checked against torch
        # in tests/unit/test_embed_backends.py across batch sizes and lengths.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Pipeline(st.eval()), args, str(out / "model.onnx"), input_names=input_names,
            output_names=["embedding"], dynamic_axes=axes, opset_version=OPSET, dynamo=False,
        )


# A folder of exports shared by every cache folder (optional); the exports of a cache folder are linked from it.
SHARED_EXPORTS_ENV = "EVALUATOR_SHARED_EXPORTS"
_BUILT: dict[str, Path] = {}  # export name -> a folder this process built or read it in


def _link_tree(src: Path, dst: Path) -> None:
    for f in src.iterdir():
        try:
            os.link(f, dst / f.name)  # same file system: no copy of the ~90 MB weights
        except OSError:
            shutil.copy2(f, dst / f.name)


def _folder(root: Path, load_path: str, cache_name: str, kind: str) -> Path:
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in cache_name)[-120:]
    return CacheLayout(root).exports / slug / f"{kind}-{_fingerprint(load_path, kind)}"


class ModelLoadError(EmbedderError):
    """The model itself could not be loaded to be exported: (exception type name, its message); the
    embedder turns it into its one line naming the model."""


# Build exports in a child process (spawned: a fresh interpreter, so nothing of the parent's memory is
# copied) whose memory ends with it: exporting in the run's own process left torch, sentence-transformers and
# the traced graph resident (bench/README.md, "retrieval/backends.py"); the study itself never imports torch.
ISOLATED_BUILD = True


def export(load: Callable[[], Any], load_path: str, cache_name: str, kind: str, root: Path,
           timings: dict[str, float] | None = None) -> Path:
    """The export folder for `kind` ("onnx-fp32", "onnx-int8", "openvino-fp32"), built on first use
    (or linked from another cache folder this process already exported into, as tests do). A build runs
    in a child process that loads the model itself (`ISOLATED_BUILD`; otherwise here, with `load`, which
    gives the SentenceTransformer). `timings` gains the build's `model_load_s` and `export_s`."""
    final = _folder(root, load_path, cache_name, kind)
    name = final.name
    if not final.is_dir() and name in _BUILT and _BUILT[name].is_dir():
        atomic_folder(final, lambda d: _link_tree(_BUILT[name], d))
    shared = os.environ.get(SHARED_EXPORTS_ENV)
    if not final.is_dir() and shared and Path(shared).resolve() != root.resolve():
        # Every cache folder on this machine links one export (the test suite's fresh caches, a user's
        # per-project caches): exporting costs CPU each time (bench/README.md, "retrieval/backends.py"),
        # linking nothing.
        source = export(load, load_path, cache_name, kind, Path(shared), timings)
        atomic_folder(final, lambda d: _link_tree(source, d))
    if not final.is_dir():
        final.parent.mkdir(parents=True, exist_ok=True)
        # Two processes on one cache folder (two studies started together, the test suite's two workers on the
        # shared exports) build it once: the second waits for the first's build and finds it done.
        with FileLock(final.parent / f".{final.name}.lock"):
            if not final.is_dir():
                if ISOLATED_BUILD:
                    spent = _build_in_child(load_path, cache_name, kind, root)
                else:
                    spent = _build_here(load, load_path, cache_name, kind, root)
                if timings is not None:
                    for k, v in spent.items():
                        timings[k] = timings.get(k, 0.0) + v
    _BUILT[name] = final
    return final


def _build_here(load: Callable[[], Any], load_path: str, cache_name: str, kind: str, root: Path) -> dict[str, float]:
    """Builds `kind` (and the ONNX export it derives from) in this process; the seconds spent loading the
    model and exporting."""
    t0 = time.perf_counter()
    loaded: list[float] = []

    def timed_load() -> Any:
        t = time.perf_counter()
        st = load()
        loaded.append(time.perf_counter() - t)
        return st

    _build(timed_load, load_path, cache_name, kind, root, _folder(root, load_path, cache_name, kind))
    load_s = sum(loaded)
    return {"model_load_s": load_s, "export_s": time.perf_counter() - t0 - load_s}


def quiet_loading() -> None:
    """transformers >= 5 draws its own "Loading weights" bar on stderr for every model load, past the
    evaluator's Reporter (so past --no-progress): the load is seconds, our own bars say what is happening."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _child_build(load_path: str, cache_name: str, kind: str, root: str) -> dict[str, float]:
    """The child's work: load the model once (only if a build needs it) and build."""
    st: list[Any] = []

    def load() -> Any:
        if not st:
            from sentence_transformers import SentenceTransformer

            quiet_loading()
            try:
                # float(): the export is of the fp32 graph, also for a model folder saved in half precision
                st.append(SentenceTransformer(load_path, device="cpu").float())
            except (OSError, ValueError, RuntimeError) as e:
                raise ModelLoadError(type(e).__name__, str(e)[:300]) from None
        return st[0]

    return _build_here(load, load_path, cache_name, kind, Path(root))


def _build_in_child(load_path: str, cache_name: str, kind: str, root: Path) -> dict[str, float]:
    """`_build_here` in a spawned process; its exceptions are raised here."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(_child_build, load_path, cache_name, kind, str(root)).result()


def _build(load: Callable[[], Any], load_path: str, cache_name: str, kind: str, root: Path, final: Path) -> Path:
    if kind == "onnx-fp32":
        st = load()

        def onnx(d: Path) -> None:
            _export_onnx(st, d, input_names_of(st))
            _keep_tokenizer(st, d)

        return atomic_folder(final, onnx)
    base = _folder(root, load_path, cache_name, "onnx-fp32")
    if not base.is_dir():
        _build(load, load_path, cache_name, "onnx-fp32", root, base)
    if kind == "onnx-int8":
        convert: Callable[[Path], None] = lambda d: _quantize(base / "model.onnx", d / "model.onnx")  # noqa: E731
    elif kind == "openvino-fp32":
        import openvino as ov

        convert = lambda d: ov.save_model(  # noqa: E731
            ov.convert_model(str(base / "model.onnx")), str(d / "model.xml"), compress_to_fp16=False)
    else:
        raise ValueError(f"unknown export kind {kind!r}")

    def derived(d: Path) -> None:
        convert(d)
        for f in (TOKENIZER_FILE, INFO_FILE):
            if (base / f).is_file():
                shutil.copy2(base / f, d / f)

    return atomic_folder(final, derived)


def _keep_tokenizer(st, out: Path) -> None:
    """Writes the model's tokenizer for `TextTokenizer` when it gives sentence-transformers' exact
    features on `PROBES`; otherwise nothing (runs then tokenise through sentence-transformers)."""
    try:
        tk = Tokenizer.from_str(st.tokenizer.backend_tokenizer.to_str())
        pad_id = st.tokenizer.pad_token_id
    except AttributeError:  # a slow (Python) tokenizer has no `tokenizers` form
        return
    if pad_id is None:
        return
    tk.no_padding()
    tk.enable_truncation(int(st.max_seq_length))
    names = input_names_of(st)
    mine = TextTokenizer(tk, names, int(pad_id))
    ref = features(st, PROBES)
    got = mine.features(mine.ids(PROBES))
    if any(not np.array_equal(ref[n].numpy(), got[n]) for n in names):
        return
    (out / TOKENIZER_FILE).write_text(tk.to_str(), encoding="utf-8")
    (out / INFO_FILE).write_text(json.dumps({
        "input_names": names, "pad_id": int(pad_id), "max_seq_length": int(st.max_seq_length),
        "dimension": dimension_of(st)}), encoding="utf-8")


_TOKENIZE_CHUNK = 4096  # texts per `encode_batch`: bounds the tokenizer's own objects alive at once


class TokenIds:
    """Token ids of many texts in one flat int32 array; `ids[i]` is text i's ids (a view)."""

    def __init__(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        self.flat = flat
        self.lengths = lengths
        self.starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(lengths) else lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        lo = int(self.starts[i])
        return self.flat[lo : lo + int(self.lengths[i])]

    def __iter__(self):
        return (self[i] for i in range(len(self)))


class TextTokenizer:
    """The exported model's tokenizer without torch: token ids once per text, padded per batch as
    sentence-transformers pads them (right, to the batch's longest, with the model's pad id)."""

    def __init__(self, tokenizer: Any, input_names: list[str], pad_id: int, dimension: int = 0) -> None:
        self.tokenizer = tokenizer
        self.input_names = input_names
        self.pad_id = pad_id
        self.dimension = dimension

    @classmethod
    def load(cls, folder: Path) -> TextTokenizer | None:
        """The tokenizer kept in an export folder, or None where it has none (or an unreadable one)."""
        try:
            info = json.loads((folder / INFO_FILE).read_text(encoding="utf-8"))
            tk = Tokenizer.from_str((folder / TOKENIZER_FILE).read_text(encoding="utf-8"))
            return cls(tk, list(info["input_names"]), int(info["pad_id"]), int(info["dimension"]))
        except Exception:  # noqa: BLE001 - tokenizers raises a bare Exception on a damaged file
            return None  # missing, damaged or foreign: tokenise through sentence-transformers

    def ids(self, texts: list[str]) -> TokenIds:
        """Every text's token ids, packed (4 bytes a token). Tokenised in chunks: a whole registry's `Encoding`
        objects and per-text lists of Python ints at once are many times the packed ids (bench/README.md,
        "retrieval/backends.py")."""
        flat: list[np.ndarray] = []
        lengths = np.zeros(len(texts), np.int64)
        for lo in range(0, len(texts), _TOKENIZE_CHUNK):
            enc = self.tokenizer.encode_batch(texts[lo : lo + _TOKENIZE_CHUNK])
            lengths[lo : lo + len(enc)] = [len(e.ids) for e in enc]
            flat.append(np.fromiter(itertools.chain.from_iterable(e.ids for e in enc), np.int32))
        return TokenIds(np.concatenate(flat) if flat else np.zeros(0, np.int32), lengths)

    def features(self, ids: Sequence[Any] | TokenIds) -> dict[str, np.ndarray]:
        width = max(map(len, ids), default=0)
        input_ids = np.full((len(ids), width), self.pad_id, np.int64)
        mask = np.zeros((len(ids), width), np.int64)
        for j, row in enumerate(ids):
            input_ids[j, : len(row)] = row
            mask[j, : len(row)] = 1
        out = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}
        return {n: out[n] for n in self.input_names}


def _quantize(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # it logs a pre-processing hint on the root logger at every export
    try:
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True)
    finally:
        root.setLevel(level)


def features(st, texts: list[str]) -> dict:
    """The model's own tokenisation (`preprocess` in sentence-transformers >= 5, `tokenize` before)."""
    return (st.preprocess if hasattr(st, "preprocess") else st.tokenize)(texts)


def dimension_of(st) -> int:
    """The embedding dimension (`get_embedding_dimension` since sentence-transformers 6)."""
    get = getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension
    return int(get())


def input_names_of(st) -> list[str]:
    feats = features(st, ["x"])
    return [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in feats]


def onnxruntime_runner(model_file: Path, threads: int) -> tuple[Runner, str]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Idle workers sleep instead of spinning: a shared machine's other processes keep their cores.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    sess = ort.InferenceSession(str(model_file), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def run(feats: dict[str, np.ndarray]) -> np.ndarray:
        return sess.run(None, {n: feats[n] for n in names})[0]

    return run, f"onnxruntime {ort.__version__}, {threads} thread{'s' if threads > 1 else ''}"


# Padded tokens per forward pass at most, for a runner that does not say otherwise (`batch_tokens`).
BATCH_TOKENS = 8192
# OpenVINO's streamed batches (`openvino_runner`'s `stream`): one request's batch, as each stream ran half
# of an 8,192-token batch before, so each stream's buffers stay as large as they were (memory unchanged).
STREAM_BATCH_TOKENS = 4096


def openvino_runner(model_file: Path, precision: str, threads: int) -> tuple[Runner, str]:
    """One single-threaded stream per CPU: one thread per product wastes less on synchronisation than two
    sharing each.

    `run(features)` splits one batch between the streams and waits for both. `run.stream(batches)` keeps
    every stream busy instead: each batch whole to the next free stream, the next batch padded while the
    last ones run, the vectors handed back in order. (Both measured: bench/README.md,
    "retrieval/backends.py".)"""
    import openvino as ov
    import openvino.properties as props
    import openvino.properties.hint as hints

    streams = max(1, threads)
    core = ov.Core()
    compiled = core.compile_model(str(model_file), "CPU", {
        hints.inference_precision: ov.Type.bf16 if precision == "bf16" else ov.Type.f32,
        hints.performance_mode: hints.PerformanceMode.THROUGHPUT,
        props.num_streams: streams,
        props.inference_num_threads: threads,
        # Pinned threads cannot move off a core that another process is using.
        hints.enable_cpu_pinning: False,
    })
    actual = compiled.get_property(hints.inference_precision).get_type_name()  # what the CPU really runs
    names = [p.get_any_name() for p in compiled.inputs]
    queue = ov.AsyncInferQueue(compiled, streams)
    # Each call's vectors go to its own dict (the request's userdata: (dict, position)), so a stream in
    # progress and a call from another thread never mix their results.
    queue.set_callback(lambda request, into: into[0].__setitem__(into[1], request.get_output_tensor(0).data.copy()))
    lock = threading.Lock()  # one queue: calls from several threads take turns submitting

    def run(feats: dict[str, np.ndarray]) -> np.ndarray:
        n = len(feats[names[0]])
        bounds = [round(i * n / streams) for i in range(streams + 1)]
        parts: dict[int, np.ndarray] = {}
        with lock:
            for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
                if hi > lo:
                    queue.start_async({name: feats[name][lo:hi] for name in names}, (parts, i))
            queue.wait_all()
        return np.concatenate([parts[i] for i in sorted(parts)])

    def stream(batches: Iterable[tuple[Any, dict[str, np.ndarray]]]) -> Iterator[tuple[Any, np.ndarray]]:
        done: dict[int, np.ndarray] = {}
        keys: list[Any] = []
        given = 0
        for key, feats in batches:  # padded here, on this thread, while the streams run the earlier ones
            with lock:
                queue.start_async({name: feats[name] for name in names}, (done, len(keys)))  # waits for a stream
            keys.append(key)
            while given in done:
                yield keys[given], done.pop(given)
                given += 1
        with lock:
            queue.wait_all()
        for i in range(given, len(keys)):  # the rest, in order
            yield keys[i], done.pop(i)

    def release() -> None:
        # The activations of the largest batch stay allocated for the next one; once a call's batches are
        # done they are handed back (bench/README.md, "retrieval/backends.py"), so the rest of a study does
        # not carry them.
        with lock:
            queue.wait_all()  # a stream its caller left part-way (an error writing a shard) may still be running
            compiled.release_memory()
        trim_heap()

    # a `Runner` is a plain callable to the type checker; the OpenVINO one carries these three as well
    run.release = release  # type: ignore[attr-defined]
    run.stream = stream  # type: ignore[attr-defined]
    run.batch_tokens = STREAM_BATCH_TOKENS  # type: ignore[attr-defined]
    return run, (f"openvino {ov.get_version().split('-')[0]}, {actual} compute, "
                 f"{streams} stream{'s' if streams > 1 else ''} x 1 thread, batches streamed")


def stream(run: Runner, batches: Iterable[tuple[Any, dict[str, np.ndarray]]]) -> Iterator[tuple[Any, np.ndarray]]:
    """(key, vectors) for each (key, features) of `batches`, in their order: pipelined where the runner
    can (OpenVINO's streams), one batch after another otherwise."""
    if callable(own := getattr(run, "stream", None)):
        yield from own(batches)
        return
    for key, feats in batches:
        yield key, run(feats)


def batch_tokens(run: Runner) -> int:
    """Padded tokens per forward pass at most for `run` (`BATCH_TOKENS` unless it says otherwise)."""
    return int(getattr(run, "batch_tokens", BATCH_TOKENS))


def release(run: Runner) -> None:
    """Hands back what a runner keeps allocated between batches (OpenVINO's activations), if anything."""
    if callable(free := getattr(run, "release", None)):
        free()


def trim_heap() -> None:
    """Returns the C heap's free pages to the system (glibc's malloc_trim; nothing elsewhere): freed
    large blocks otherwise stay counted in the process's RSS."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
        ctypes.CDLL(None).malloc_trim(0)
