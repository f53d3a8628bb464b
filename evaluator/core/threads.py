"""CPU thread sizing for the numeric libraries (torch, ONNX Runtime, OpenVINO, FAISS).

Two things keep an embedder from collapsing when the machine is shared:
- pools sized to the CPUs this process may actually use (its affinity mask and the cgroup's CPU
  quota), not the host's core count, which containers and `taskset` hide from `os.cpu_count()`;
- a passive wait policy, so a thread that waits for its siblings sleeps instead of spinning on a
  core another process needs. OpenMP reads `OMP_WAIT_POLICY` once, when the runtime loads, so
  `configure_env()` must run before torch or faiss is first imported (embed.py and index.py call
  it at import time, before they import either).

`EVALUATOR_THREADS` overrides the count (e.g. to leave a core free for something else).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Iterator
from pathlib import Path

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_TOKENIZER_ENV = threading.Lock()


def _quota_at(folder: Path) -> float | None:
    """CPUs allowed by one cgroup folder's CFS quota (v2 `cpu.max`, else v1), None when unlimited."""
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        q = int((folder / "cpu.cfs_quota_us").read_text())
        p = int((folder / "cpu.cfs_period_us").read_text())
        return q / p if q > 0 and p > 0 else None
    except (OSError, ValueError):
        return None


def _own_cgroup(proc: Path = Path("/proc/self/cgroup")) -> str:
    """This process's cgroup path (v2 `0::/x`, else v1's `cpu` controller), '' when unknown."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" or "cpu" in controllers.split(","):
            return path.strip("/")
    return ""


def _cgroup_quota(root: Path = _CGROUP_ROOT, own: str | None = None) -> float | None:
    """The tightest CFS quota on this process's cgroup and its ancestors (a container's limit can
    sit on any level); None when none is set."""
    own = _own_cgroup() if own is None else own
    quotas = []
    for base in (root, root / "cpu"):  # v2 unified, v1 cpu controller
        folder = base / own if own else base
        while True:
            q = _quota_at(folder)
            if q is not None:
                quotas.append(q)
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return min(quotas) if quotas else None


def available_cpus() -> int:
    """The number of CPUs this process can keep busy: min(affinity, cgroup quota), at least 1."""
    override = os.environ.get("EVALUATOR_THREADS", "").strip()
    if override.isdigit() and int(override) > 0:
        return int(override)
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        n = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        # A 1.5-CPU quota throttles a second thread half the time: round down, keep one.
        n = min(n, max(1, math.floor(quota)))
    return max(1, n)


def configure_env() -> int:
    """Set the thread environment before torch/faiss load; returns the thread count.

    Uses setdefault: a user's own OMP_NUM_THREADS / OMP_WAIT_POLICY win.
    """
    n = available_cpus()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    os.environ.setdefault("MKL_NUM_THREADS", str(n))
    # HF tokenizers' own thread pool would compete with the model's threads for the same cores.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return n


def configure_torch(n: int | None = None) -> None:
    import torch

    n = n or available_cpus()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # only possible before torch's first parallel work
        torch.set_num_interop_threads(1)


@contextlib.contextmanager
def tokenizer_threads(parallel: bool) -> Iterator[None]:
    """HF tokenizers on every core inside the block when `parallel` (a GPU runs the model: the CPU cores are
    free), else as `configure_env` left it. tokenizers reads TOKENIZERS_PARALLELISM at each batch call."""
    if not parallel:
        yield
        return
    with _TOKENIZER_ENV:  # two threads' blocks must not restore each other's value
        before = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("TOKENIZERS_PARALLELISM", None)
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = before
