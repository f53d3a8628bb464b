"""One writer per output folder: a lock file in the folder, held (`fcntl.flock`) for as long as a command writes it.

A study, `report`, `scaling`, `routing` and `view` (where it writes its page) take it before any work; a second
writer finds it held and stops at once with one line naming the holder (pid, host, what it runs, since when) and
what to do. The kernel frees the lock when its process ends, however it ends (SIGKILL included), so a lock file
left behind by a dead process is no lock: the next writer takes it over and says whose it was. Within one
process the lock is re-entrant (a study's render writes the same folder). The file is removed when its writer is
done, and a folder the lock created is removed again if nothing was written into it.

On one host, or on a network file system whose locks span hosts (NFS v4 locks do), two writers never overlap.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from evaluator.core.errors import OutputError

LOCK_FILE = ".evaluator.lock"
_held: dict[Path, tuple[int, int]] = {}  # lock file -> (open descriptor, depth) of the locks this process holds


def _holder(fd: int) -> dict[str, str]:
    """What the lock file says of its writer: pid, host, command, started (empty when it says nothing)."""
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096).decode("utf-8", "replace")
    out = {}
    for line in raw.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            out[name.strip()] = value.strip()
    return out


def _describe(h: dict[str, str]) -> str:
    if not h.get("pid"):
        return "another evaluator process"
    return (f"pid {h['pid']} on {h.get('host', '?')} ({h.get('command', 'a command')} started "
            f"{h.get('started', '?')})")


def _alive(h: dict[str, str]) -> bool | None:
    """Whether the writer a lock file names still runs: None when it cannot be told from here (another host)."""
    if h.get("host") != socket.gethostname():
        return None
    try:
        os.kill(int(h.get("pid", "")), 0)
    except ProcessLookupError:
        return False
    except (ValueError, PermissionError, OSError):
        return None
    return True


@contextlib.contextmanager
def writing(folder: Path, command: str, note: Callable[[str], None] = lambda _m: None) -> Iterator[None]:
    """Hold `folder`'s lock while the block runs (see the module doc); `note` hears of a lock taken over."""
    folder = Path(folder)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = (folder / LOCK_FILE).resolve()
    if path in _held:  # this process writes the folder already (a study's render)
        fd, depth = _held[path]
        _held[path] = (fd, depth + 1)
        try:
            yield
        finally:
            fd, depth = _held[path]
            _held[path] = (fd, depth - 1)
        return
    fd = _acquire(folder, path, command, note)
    _held[path] = (fd, 1)
    try:
        yield
    finally:
        del _held[path]
        with contextlib.suppress(OSError):
            path.unlink()  # before the unlock: a writer waiting on this file sees it gone and opens the new one
        os.close(fd)
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty: a command that stopped before writing leaves nothing behind


def _acquire(folder: Path, path: Path, command: str, note: Callable[[str], None]) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            h = _holder(fd)
            os.close(fd)
            kill = f" (kill {h['pid']})" if h.get("pid") and _alive(h) else ""
            raise OutputError(f"{folder} is being written by {_describe(h)}; wait for it to finish or stop it{kill}, "
                              "or write to another folder (--out)") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the file was removed by the writer that held it: lock the one now at `path`
    left = _holder(fd)
    if left.get("pid"):
        gone = "which is no longer running" if _alive(left) is False else "whose lock was free"
        note(f"note: {folder}: took over the lock left by {_describe(left)}, {gone}")
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (f"pid={os.getpid()}\nhost={socket.gethostname()}\ncommand={command}\n"
                  f"started={time.strftime('%Y-%m-%d %H:%M:%S %z')}\n").encode())
    return fd
