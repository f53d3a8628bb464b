"""The one atomic write: a file (or a folder of files) is made under a private temporary name and renamed
into place, so a reader never sees half of it and a kill leaves the old one (or nothing), never a torso.

Every file a reader or a later run relies on is written through it: the output folder (`results.schema`), the
caches (embedding shards, kept searches, BM25 indexes, runtime exports, analyses, figures) and request files.
What a failure means is the caller's: an output file is an error the CLI prints as one line, a cache file that
cannot be written only costs the next run the work again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def _temporary(path: Path) -> Path:
    # A dot name that no reader globs for, unique per process and call (two writers never share one).
    return path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")


def atomic_write(path: Path, data: str | bytes | Callable[[BinaryIO], None], *, durable: bool = False) -> None:
    """Write `data` (text as UTF-8, bytes, or a function that writes into the open binary file) to `path`.

    `durable` (with a function): fsync before the rename, for files a power cut must not empty (the
    embedding shards). An `OSError` (disk full, read-only folder) leaves no temporary file behind and
    names `path`, the file the user knows, with the errno kept for the caller's message."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    try:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        elif isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            with open(tmp, "wb") as fh:
                data(fh)
                if durable:
                    fh.flush()
                    os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror or str(e), str(path)) from None


def atomic_folder(final: Path, build: Callable[[Path], None]) -> Path:
    """`final`, built by `build(folder)` into a private folder and renamed into place once complete; kept
    as it is when it exists. Of two processes building at once the first rename wins and the other's copy
    is dropped; any other failure is raised (an `OSError`), with no temporary folder left."""
    if final.is_dir():
        return final
    tmp = _temporary(final)
    try:
        tmp.mkdir(parents=True)
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


def sha256_file(path: Path, block: int = 8 << 20) -> str:
    """The file's sha256, read in blocks (8 MiB: disk speed without holding a model file in memory); the one
    check of a bundled model's weights (`bundled`, `llamacpp.weights`)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            h.update(chunk)
    return h.hexdigest()
