"""Figures drawn once per change of their data: `render.charts` (and the scaling and routing sections) draw
PNG bytes from values; this module decides whether to draw at all, and writes what was drawn.

A group of figures (the main study's, scaling's, routing's) is drawn only when its inputs (the JSON-able
values the figures are drawn from) or the drawing code changed since it was last drawn into that folder, or a
PNG is missing or altered; else the PNGs already there stay, byte for byte what drawing again would write
(matplotlib's Agg output is deterministic). A store (the cache folder's `figures/`) keeps every drawn set by
the digest of its inputs, so a new output folder of an unchanged study gets copies instead of drawings. A
rerun that changes nothing in the figures' data skips matplotlib altogether.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from evaluator.core.files import atomic_folder, atomic_write
from evaluator.render import charts, routing_section, scaling_section

STAMPS = ".drawn.json"  # in the figures folder: per group, the digest of its inputs and of each PNG
_DRAWING_MODULES = (charts, scaling_section, routing_section)  # the code that draws every figure
_MANIFEST = "files.json"
_VOLATILE = ("timing_s", "embed", "created")  # meta entries of an analysis that no figure shows


@functools.cache
def _code_digest() -> str:
    """The drawing code (render's charts and the scaling and routing sections) and matplotlib's version: a change
    to either redraws every figure."""
    h = hashlib.blake2b(digest_size=16)
    for module in _DRAWING_MODULES:
        f = Path(module.__file__ or "")
        h.update(f.name.encode() + f.read_bytes())
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        h.update(importlib.metadata.version("matplotlib").encode())
    return h.hexdigest()


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _file_digest(path: Path) -> str | None:
    try:
        return _digest(path.read_bytes())
    except OSError:
        return None


def figure_inputs(result: Mapping[str, Any]) -> dict[str, Any]:
    """A saved analysis (scaling.json, routing.json) less what changes on every rerun without changing its
    figure (timings, cache counts), so a rerun with the same numbers draws nothing."""
    meta = {k: v for k, v in (result.get("meta") or {}).items() if k not in _VOLATILE}
    return {**result, "meta": meta}


def drawn(fig_dir: Path, group: str, inputs: Any, draw: Callable[[], Mapping[str, bytes]],
          store: Path | None = None) -> list[Path]:
    """The group's figures in `fig_dir`, drawn (`draw()`: file name -> PNG bytes) and written only when needed
    (module docstring); returns their paths, sorted."""
    digest = hashlib.blake2b(json.dumps([_code_digest(), group, inputs], sort_keys=True, default=repr)
                             .encode(), digest_size=16).hexdigest()
    stamps_file = fig_dir / STAMPS
    try:
        stamps = json.loads(stamps_file.read_text())
    except (OSError, ValueError):
        stamps = {}
    if not isinstance(stamps, dict):
        stamps = {}
    old = stamps.get(group)
    if isinstance(old, dict) and old.get("inputs") == digest and isinstance(old.get("files"), dict) and all(
            _file_digest(fig_dir / name) == h for name, h in old["files"].items()):
        return sorted(fig_dir / name for name in old["files"])
    blobs = _from_store(store / digest) if store is not None else None
    if blobs is None:
        blobs = dict(draw())
        if store is not None:
            _to_store(blobs, store / digest)
    fig_dir.mkdir(parents=True, exist_ok=True)
    for name, b in blobs.items():
        atomic_write(fig_dir / name, b)  # a kill mid-write leaves the old PNG, never half of one
    stamps[group] = {"inputs": digest, "files": {name: _digest(b) for name, b in blobs.items()}}
    with contextlib.suppress(OSError):  # a read-only folder: the figures are there, only the next skip is lost
        atomic_write(stamps_file, json.dumps(stamps, indent=1, sort_keys=True))
    return sorted(fig_dir / name for name in blobs)


def _from_store(folder: Path) -> dict[str, bytes] | None:
    """The stored set, or None when absent or damaged (then it is drawn)."""
    try:
        files = json.loads((folder / _MANIFEST).read_text())
        blobs = {name: (folder / name).read_bytes() for name in files}
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(files, dict) or any(_digest(b) != files[n] for n, b in blobs.items()):
        return None
    return blobs


def _to_store(blobs: Mapping[str, bytes], folder: Path) -> None:
    """Keep a drawn set under its digest, built atomically (a reader never sees half a set). A cache that
    cannot be written only costs the next run a drawing."""
    def build(tmp: Path) -> None:
        for name, b in blobs.items():
            (tmp / name).write_bytes(b)
        (tmp / _MANIFEST).write_text(json.dumps({n: _digest(b) for n, b in blobs.items()}, sort_keys=True))

    with contextlib.suppress(OSError):
        atomic_folder(folder, build)
