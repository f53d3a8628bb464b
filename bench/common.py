"""Shared plumbing of the benchmarks: result records, tables, machine facts, caches, RSS sampling."""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
PROJECT_CACHE = REPO / "cache"  # the project's warm cache: read (symlinked) only, never written
BENCH_CACHE = BENCH / ".cache"  # embeddings the benchmarks add (PtR stubs); git-ignored, reusable
PYTHON = sys.executable
PACKAGES = ("torch", "sentence-transformers", "transformers", "faiss-cpu", "numpy", "aiohttp", "openai",
            "diskcache", "orjson", "psutil")


@dataclass
class Goal:
    what: str
    value: float
    target: str  # e.g. "<= 1.05"
    met: bool


@dataclass
class Result:
    """What one benchmark reports: a table for people, `data` for machines, goals checked."""

    name: str
    title: str
    columns: list[str]
    rows: list[list[Any]]
    notes: list[str] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    command: str = ""
    machine: dict[str, Any] = field(default_factory=dict)
    extra_tables: list[dict[str, Any]] = field(default_factory=list)  # {"title", "columns", "rows"}

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "title": self.title, "command": self.command, "seconds": round(self.seconds, 1),
            "machine": self.machine, "goals": [g.__dict__ for g in self.goals],
            "table": {"columns": self.columns, "rows": self.rows}, "extra_tables": self.extra_tables,
            "notes": self.notes, "data": self.data,
        }


def fmt(x: Any, digits: int = 3) -> str:
    """Compact human formatting for table cells (numbers get thousands separators)."""
    if isinstance(x, bool) or x is None:
        return "-" if x is None else ("yes" if x else "no")
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if x != x:  # NaN: a figure not measured (e.g. embed_first_run --order now-only has no 'before')
            return "-"
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        return f"{x:.{digits}g}" if abs(x) < 1 else f"{x:,.{max(1, digits - len(str(int(abs(x)))))}f}"
    return str(x)


def machine() -> dict[str, Any]:
    """The facts a reader needs to compare runs: cores, CPU, RAM, Python, versions, load at the time."""
    import psutil

    cpu = platform.processor() or "unknown"
    vector: list[str] = []  # the SIMD extensions the embedding runtimes use: the same code differs 3x across them
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == (platform.processor() or "unknown"):
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not vector:
                vector = sorted(f for f in line.split(":", 1)[1].split()
                                if f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_bf16",
                                         "amx_int8", "amx_tile", "avx_vnni"))
    versions = {}
    for p in PACKAGES:
        try:
            versions[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            versions[p] = None
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "cpu_vector": vector,
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "packages": versions,
        # Other people share this machine: the load says how much of it the benchmark had.
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def print_result(r: Result) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=160)  # logs are not terminals; keep tables unwrapped
    tables = [{"title": r.title, "columns": r.columns, "rows": r.rows}, *r.extra_tables]
    for t in tables:
        table = Table(title=t["title"], title_justify="left")
        for i, c in enumerate(t["columns"]):
            table.add_column(c, justify="left" if i == 0 else "right")
        for row in t["rows"]:
            table.add_row(*(fmt(c) for c in row))
        con.print(table)
    for g in r.goals:
        con.print(f"  goal {g.what}: {fmt(g.value, 4)} (target {g.target}) -> {'MET' if g.met else 'MISSED'}")
    for n in r.notes:
        con.print(f"  - {n}", highlight=False)
    con.print(f"  ({r.seconds:.0f} s)")


def finish(r: Result, started: float, machine_at_start: dict[str, Any], module: str) -> Path:
    """A standalone bench's ending: its wall time, the load at its end beside the load at its start, the
    command as run, printed and written."""
    r.seconds = time.perf_counter() - started
    r.machine = machine_at_start | {"loadavg_1m_end": round(os.getloadavg()[0], 2)}
    r.command = f"python -m {module} " + " ".join(sys.argv[1:])
    print_result(r)
    return write_result(r)


def write_result(r: Result) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{r.name}.json"
    tmp = out.with_suffix(".json.tmp")
    tmp.write_bytes(orjson.dumps(r.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    tmp.replace(out)
    return out


# ---------------------------------------------------------------- caches


def link_embeddings(dst_root: Path, sources: Sequence[Path] = (PROJECT_CACHE,)) -> int:
    """Make `dst_root/embeddings` hold symlinks to every embedding shard under `sources`.

    Shards are linked one file at a time, never the folder: new shards the run writes land in
    `dst_root` as real files, so the project's cache is read but never changed.
    """
    n = 0
    for src in sources:
        for shard in src.glob("embeddings/*/*/shard-*.npz"):
            target = dst_root / shard.relative_to(src)
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(shard.resolve())
            n += 1
    return n


@contextlib.contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=f"bench-{prefix}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- memory


class TreeRSS:
    """Samples the summed RSS of a process and all its descendants in a background thread."""

    def __init__(self, pid: int, every_s: float = 0.05) -> None:
        import psutil

        self.root = psutil.Process(pid)
        self.every_s = every_s
        self.peak = 0
        self.peak_by_name: dict[str, int] = {}
        self.largest = 0  # the largest RSS of any one process of the tree
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        import psutil

        while not self._stop.is_set():
            total = 0
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                break
            for p in procs:
                try:
                    rss = p.memory_info().rss
                    cmd = " ".join(p.cmdline())
                    name = ("simulator" if "simulator" in cmd else "main" if p == self.root
                            else "export child" if "multiprocessing" in cmd else p.name())
                except psutil.Error:
                    continue  # exited between listing and reading
                total += rss
                self.largest = max(self.largest, rss)
                self.peak_by_name[name] = max(self.peak_by_name.get(name, 0), rss)
            self.peak = max(self.peak, total)
            self.samples += 1
            self._stop.wait(self.every_s)

    def __enter__(self) -> TreeRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------- running the command line


@functools.cache
def data_dir() -> str:
    """The data folder the working tree's config names, passed explicitly to every command (a
    checkout elsewhere would resolve the config's relative path from its own folder)."""
    from evaluator.data import resolve_data_dir
    from evaluator.settings.load import load_settings
    from evaluator.settings.paths import REPO_ROOT

    return str(resolve_data_dir(None, load_settings().data.dir, REPO_ROOT))


def checkout(rev: str, dst: Path) -> Path:
    """The tree at `rev`, unpacked (read-only use of git: nothing in the work tree changes)."""
    archive = subprocess.run(["git", "archive", rev], cwd=REPO, capture_output=True, check=True).stdout
    dst.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(dst)], input=archive, check=True)
    return dst


def children_cpu() -> float:
    """User + system CPU seconds of every finished child process (and theirs): less sensitive than
    wall time to other people's load on a shared machine."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_cli(code: Path, args: Sequence[str]) -> tuple[float, float]:
    """`python -m evaluator ARGS` run from the code folder `code` (the working tree or a checkout):
    (wall seconds, CPU seconds); a failure raises with the command's last error lines."""
    cmd = [PYTHON, "-m", "evaluator", *args]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cpu0 = children_cpu()
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=code, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} in {code} failed ({p.returncode}): {p.stderr[-2000:]}")
    return wall, children_cpu() - cpu0

