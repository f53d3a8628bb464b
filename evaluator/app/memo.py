"""Analyses computed once per change of their inputs: a rerun whose records, settings and code are those of an
earlier run reads the main study's summary and the scaling and routing results back from the cache folder
(`cache/analyses/`) instead of computing them again: they are most of a warm rerun's work, scipy.stats' import
half of that (bench/README.md, "app/memo.py").

An analysis is kept by the digest of its name, its inputs as its caller states them (the records as written in
queries.jsonl, the study as summary.json states it, whatever else the analysis reads), the evaluator's source
(every module: a change anywhere computes every analysis again) and the versions of Python and of the libraries
that compute numbers. What is read back is what computing again would give, so the outputs are the same bytes;
an entry that is damaged, unreadable or of another format is computed again, and a cache that cannot be
written only costs the next run the computation. The folder is safe to delete.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import pickle
import platform
from collections.abc import Callable
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, TypeVar

from evaluator.core.files import atomic_write

T = TypeVar("T")
_LIBRARIES = ("numpy", "scipy", "faiss-cpu", "bm25s", "pydantic", "pydantic-core")
_MAX_BYTES = 256 * 2**20  # a larger result (a huge study's per-query values) is not worth a file: computed again
_KEEP = 8  # entries kept per analysis, the most recently written: each change of the code or the records adds one
_DIGEST = 32  # bytes of blake2b over the pickled value, in front of it


def _sources(folder: Traversable) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for item in folder.iterdir():
        if item.is_dir() and item.name != "__pycache__":
            out += [(f"{item.name}/{n}", b) for n, b in _sources(item)]
        elif item.name.endswith(".py"):
            out.append((item.name, item.read_bytes()))
    return out


@functools.cache
def code_digest() -> str:
    """The evaluator's every module, Python's version and the numerical libraries' (read once a process)."""
    h = hashlib.blake2b(digest_size=16)
    for name, data in sorted(_sources(resources.files("evaluator"))):
        h.update(name.encode() + b"\0" + hashlib.blake2b(data, digest_size=16).digest())
    h.update(platform.python_version().encode())
    for lib in _LIBRARIES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            h.update(f"{lib}={importlib.metadata.version(lib)}".encode())
    return h.hexdigest()


def file_digest(path: Path) -> str:
    """A file's bytes (queries.jsonl: the records exactly as every analysis reads them)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class Memo:
    """The kept analyses of one output folder's records (`records`: its queries.jsonl, digested on first use);
    `store` None keeps nothing (every analysis is computed)."""

    def __init__(self, store: Path | None, records: Path) -> None:
        self.store = store
        self._records = records

    @functools.cached_property
    def records(self) -> str:
        return file_digest(self._records)

    def kept(self, name: str, inputs: Any, compute: Callable[[], T]) -> tuple[T, bool]:
        """`compute()`, or its value kept for these `inputs` (JSON-able: their repr stands for anything else);
        and whether it was read back."""
        if self.store is None:
            return compute(), False
        key = json.dumps([code_digest(), name, self.records, inputs], sort_keys=True, default=repr)
        path = self.store / f"{name}-{hashlib.blake2b(key.encode(), digest_size=16).hexdigest()}.pickle"
        got = _read(path)
        if got is not None:
            return got, True
        value = compute()
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) <= _MAX_BYTES:
            with contextlib.suppress(OSError):
                atomic_write(path, hashlib.blake2b(data, digest_size=_DIGEST).digest() + data)
                _prune(path, name)
        return value, False


def _prune(written: Path, name: str) -> None:
    """Only the `_KEEP` entries of `name` written last stay, `written` (just now) among them: the folder does not
    grow with every edit of the code."""
    others = sorted((p for p in written.parent.glob(f"{name}-*.pickle") if p != written),
                    key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in others[_KEEP - 1:]:
        with contextlib.suppress(OSError):
            old.unlink()


def _read(path: Path) -> Any:
    """The kept value, or None when absent or damaged (then it is computed)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    head, data = raw[:_DIGEST], raw[_DIGEST:]
    if hashlib.blake2b(data, digest_size=_DIGEST).digest() != head:
        return None
    try:
        return pickle.loads(data)
    except Exception:  # a type renamed since: computed again
        return None
