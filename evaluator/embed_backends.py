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

Tokenisation stays the model's own (the fast tokenizer in the sentence-transformers object), so
every backend sees exactly the token ids torch sees.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import threading
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

EXPORT_VERSION = 1  # bump when the export procedure changes: old exports are then ignored
OPSET = 17
BACKENDS = ("torch", "onnx", "openvino")
# Precisions each runtime offers on a CPU (torch's fp16 is for CUDA).
PRECISIONS = {"torch": ("fp32", "bf16", "fp16"), "onnx": ("fp32", "int8"), "openvino": ("fp32", "bf16")}
_PACKAGES = {"onnx": ("onnxruntime", "onnx"), "openvino": ("openvino", "onnx")}

Runner = Callable[[dict[str, np.ndarray]], np.ndarray]


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


def _fingerprint(load_path: str, kind: str) -> str:
    """Model files (name, size, mtime) and the export options: a changed model re-exports."""
    import torch

    h = hashlib.blake2b(digest_size=8)
    h.update(f"{EXPORT_VERSION}|{OPSET}|{kind}|torch {torch.__version__}|{load_path}".encode())
    root = Path(load_path)
    if root.is_dir():
        for f in sorted(root.rglob("*")):
            if f.is_file() and not f.name.startswith("."):
                st = f.stat()
                h.update(f"{f.relative_to(root)}|{st.st_size}|{int(st.st_mtime)}".encode())
    return h.hexdigest()


def _build_atomically(final: Path, build: Callable[[Path], None]) -> Path:
    """Build into a private folder and rename it into place: a reader never sees half an export,
    and of two processes exporting at once the first rename wins (the other's copy is dropped)."""
    if final.is_dir():
        return final
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


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
        # in tests/test_embed_backends.py across batch sizes and lengths.
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


def export(st, load_path: str, cache_name: str, kind: str, root: Path) -> Path:
    """The export folder for `kind` ("onnx-fp32", "onnx-int8", "openvino-fp32"), built on first use
    (or linked from another cache folder this process already exported into, as tests do)."""
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in cache_name)[-120:]
    name = f"{kind}-{_fingerprint(load_path, kind)}"
    final = root / "exports" / slug / name
    if not final.is_dir() and name in _BUILT and _BUILT[name].is_dir():
        _build_atomically(final, lambda d: _link_tree(_BUILT[name], d))
    shared = os.environ.get(SHARED_EXPORTS_ENV)
    if not final.is_dir() and shared and Path(shared).resolve() != root.resolve():
        # Every cache folder on this machine links one export (the test suite's fresh caches, a user's
        # per-project caches): exporting costs 10-20 s of CPU each time, linking nothing.
        source = export(st, load_path, cache_name, kind, Path(shared))
        _build_atomically(final, lambda d: _link_tree(source, d))
    if not final.is_dir():
        _build(st, load_path, cache_name, kind, root, final)
    _BUILT[name] = final
    return final


def _build(st, load_path: str, cache_name: str, kind: str, root: Path, final: Path) -> Path:
    input_names = input_names_of(st)
    if kind == "onnx-fp32":
        return _build_atomically(final, lambda d: _export_onnx(st, d, input_names))
    base = export(st, load_path, cache_name, "onnx-fp32", root) / "model.onnx"
    if kind == "onnx-int8":
        return _build_atomically(final, lambda d: _quantize(base, d / "model.onnx"))
    if kind == "openvino-fp32":
        import openvino as ov

        return _build_atomically(final, lambda d: ov.save_model(
            ov.convert_model(str(base)), str(d / "model.xml"), compress_to_fp16=False))
    raise ValueError(f"unknown export kind {kind!r}")


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


def openvino_runner(model_file: Path, precision: str, threads: int) -> tuple[Runner, str]:
    import openvino as ov
    import openvino.properties as props
    import openvino.properties.hint as hints

    core = ov.Core()
    compiled = core.compile_model(str(model_file), "CPU", {
        hints.inference_precision: ov.Type.bf16 if precision == "bf16" else ov.Type.f32,
        hints.performance_mode: hints.PerformanceMode.LATENCY,  # one stream: all threads on a batch
        props.inference_num_threads: threads,
        # Pinned threads cannot move off a core that another process is using.
        hints.enable_cpu_pinning: False,
    })
    actual = compiled.get_property(hints.inference_precision).get_type_name()  # what the CPU really runs
    request = compiled.create_infer_request()
    names = [p.get_any_name() for p in compiled.inputs]
    lock = threading.Lock()  # one infer request: calls from several threads take turns

    def run(feats: dict[str, np.ndarray]) -> np.ndarray:
        with lock:
            return request.infer({n: feats[n] for n in names})[0].copy()

    return run, f"openvino {ov.get_version().split('-')[0]}, {actual} compute, {threads} thread{'s' if threads > 1 else ''}"
