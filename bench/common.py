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
BENCHMARKS = {  # name -> module; run in this order (cheapest prerequisites first)
    "fanout": "bench.fanout",
    "overhead": "bench.overhead",
    "embedding": "bench.embedding",
    "embed_backends": "bench.embed_backends",  # speed + equivalence of the embedding runtime paths
    "embed_shared": "bench.embed_shared",  # embedding beside a busy process
    "resume": "bench.resume",
    "memory": "bench.memory",
    "scale": "bench.scale",  # memory per query and the viewer's largest file as queries grow
    "batch": "bench.batch",
    "shared_rate": "bench.shared_rate",  # two processes on one key: shared RPM pacing
    "ray_engine": "bench.ray_engine",  # requests run --engine ray vs the evaluator engine (needs the ray extra)
}
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
    stamp: dict[str, Any] = field(default_factory=dict)  # `Stamp.end()`: what was measured, where, under what load

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "title": self.title, "command": self.command, "seconds": round(self.seconds, 1),
            "stamp": self.stamp, "machine": self.machine, "goals": [g.__dict__ for g in self.goals],
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


# ---------------------------------------------------------------- what a result measured

# Written by the benchmarks, not measured by them: a tree whose only changes are these is clean.
OUTPUTS = ("bench/results/", "bench/README.md", "bench/.cache/")
STAMP_KEYS = ("commit", "dirty", "dirty_paths", "measured", "host", "load")
_LOAD_EVERY_S = 5.0


def git(*args: str) -> str | None:
    """`git ARGS` in the repository: its output, or None outside a git checkout (or without git)."""
    try:
        p = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def tree_state() -> tuple[str | None, list[str]]:
    """(HEAD's commit, the paths that differ from it: modified, staged or untracked, outputs left out)."""
    status = git("status", "--porcelain", "--untracked-files=normal")
    paths = [line[3:].split(" -> ")[-1].strip('"') for line in (status or "").splitlines() if len(line) > 3]
    return git("rev-parse", "HEAD"), [p for p in paths if not p.startswith(OUTPUTS)]


def host(m: dict[str, Any]) -> dict[str, Any]:
    """The CPU as a reader compares hosts by (`m`: `machine()`): its model, cores and the vector extensions
    the code can use."""
    return {"cpu": m["cpu"], "cores": m["cores"], "cpu_flags": m["cpu_vector"]}


class Stamp:
    """What a result file says about how it was measured (`stamp` in every JSON of bench/results/): the commit
    and whether the tree differed from it (which paths), when, on which CPU, and the load average at the start,
    at most during the run (sampled every 5 s) and at the end. Started when the benchmark starts; `end()` when it
    ends. `python -m bench --check` compares the commit with the last commit of the code the benchmark measures."""

    def __init__(self) -> None:
        self.machine = machine()
        self.commit, self.dirty_paths = tree_state()
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.load_start = [round(x, 2) for x in os.getloadavg()]
        self.max_1m = self.load_start[0]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(_LOAD_EVERY_S):
            self.max_1m = max(self.max_1m, round(os.getloadavg()[0], 2))

    def end(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        end = [round(x, 2) for x in os.getloadavg()]
        return {"commit": self.commit, "dirty": bool(self.dirty_paths), "dirty_paths": self.dirty_paths[:20],
                "measured": self.started, "host": host(self.machine),
                "load": {"start": self.load_start, "max_1m": max(self.max_1m, end[0]), "end": end}}


def stamped(payload: dict[str, Any], stamp: Stamp) -> dict[str, Any]:
    """A benchmark's own JSON (not a `Result`) with its stamp."""
    return {**payload, "stamp": stamp.end()}


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


def finish(r: Result, started: float, stamp: Stamp, module: str, command: str | None = None) -> Path:
    """A bench's ending: its wall time, the load at its end beside the load at its start, its stamp, the
    command as run (`command`, else `python -m MODULE` and this process's arguments), printed and written."""
    r.seconds = time.perf_counter() - started
    r.machine = stamp.machine | {"loadavg_1m_end": round(os.getloadavg()[0], 2)}
    r.stamp = stamp.end()
    r.command = command or (f"python -m {module} " + " ".join(sys.argv[1:])).strip()
    print_result(r)
    return write_result(r)


def write_result(r: Result) -> Path:
    if not r.stamp:
        raise ValueError(f"{r.name}: a result is written with its stamp (common.finish)")
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
    from evaluator.core.paths import REPO_ROOT
    from evaluator.data import resolve_data_dir
    from evaluator.settings.load import load_settings

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

