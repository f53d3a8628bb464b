"""`python -m bench --check`: which results are older than the code they measure, and whether the cheap
benchmarks still reproduce what their results say, within their stated noise.

A result (`bench/results/NAME.json`, or `NAME-VARIANT.json`, of the module `bench/NAME.py`) is
- **stale** when the commit its stamp records is not the last commit that changed the code its benchmark measures
  (the module's `MEASURES` paths: `git log -1 -- PATHS`) nor a descendant of it, when the tree it was measured
  on had uncommitted changes to that code (`dirty_paths`), or when git does not know the commit;
- **unstamped** when it has no stamp; a **legacy** stamp (results written before stamps existed) records no
  commit, only the commit that last changed the file: stale when the measured code changed after that one.
The cheap benchmarks (a module with `CHECK`, the keyword arguments of a quick `run`, and `NOISE`, the allowed
difference per goal: ("rel", 0.25) = a quarter of the recorded value, ("abs", 0.03)) are run again and every goal
they share with the recorded result is compared. Nothing is written: a result is recorded by running its
benchmark (`python -m bench NAME`). Exit status 1 when a result is stale, unstamped or differs beyond its noise.
The load average is shown beside each re-run: on a busy machine a difference says little.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import BENCH, BENCHMARKS, RESULTS, STAMP_KEYS, Result, Stamp, fmt, git


@dataclass
class Verdict:
    file: str
    state: str  # "fresh" | "stale" | "unstamped" | "legacy" (code unchanged since the file was committed)
    why: str


def result_files() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.json") if not p.name.endswith((".partial.json", ".tmp.json")))


def module_of(path: Path) -> str | None:
    """The benchmark module that writes a result file (`fanout.json`, `embed_shared-embedder.json`)."""
    stem = path.stem
    for name in (stem, stem.split("-")[0]):
        if (BENCH / f"{name}.py").is_file():
            return name
    return None


def measures(module: str) -> tuple[str, ...]:
    """The module's `MEASURES`, read from its source (importing it would load what it benchmarks)."""
    tree = ast.parse((BENCH / f"{module}.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MEASURES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return ()


def _short(commit: str | None) -> str:
    return (commit or "?")[:9]


def _changed_after(paths: tuple[str, ...], commit: str) -> str | None:
    """The last commit that changed `paths` when it is not `commit` nor one of its ancestors ("sha subject")."""
    last = git("log", "-1", "--format=%H %s", "--", *paths)
    if not last:
        return None
    sha, subject = (last.split(" ", 1) + [""])[:2]
    if git("merge-base", "--is-ancestor", sha, commit) is not None:
        return None  # `git merge-base --is-ancestor` exits 0 (output "") when it is an ancestor
    return f"{sha[:9]} {subject[:70]}"


def verdict(path: Path) -> Verdict:
    """Whether one result file still describes the code (see the module doc)."""
    try:
        res = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return Verdict(path.name, "unstamped", f"unreadable: {e}")
    stamp = res.get("stamp") if isinstance(res, dict) else None
    if not isinstance(stamp, dict):
        return Verdict(path.name, "unstamped", "no stamp: run the benchmark again")
    module = module_of(path)
    paths = measures(module) if module else ()
    if not paths:
        return Verdict(path.name, "stale", f"no MEASURES in bench/{module}.py" if module else "no benchmark module")
    if stamp.get("legacy"):
        since = stamp.get("committed_in")
        later = _changed_after(paths, since) if since else "?"
        if later:
            return Verdict(path.name, "stale", f"written before stamps (commit not recorded; committed in "
                                              f"{_short(since)}); the code it measures changed since: {later}")
        return Verdict(path.name, "legacy", f"commit not recorded; the code it measures is unchanged since "
                                           f"{_short(since)}, where the file was committed")
    commit = stamp.get("commit")
    if not commit or git("cat-file", "-e", f"{commit}^{{commit}}") is None:
        return Verdict(path.name, "stale", f"commit {_short(commit)} unknown to this repository")
    dirty = [p for p in stamp.get("dirty_paths") or [] if any(p == m or p.startswith(m.rstrip("/") + "/")
                                                             for m in paths)]
    if dirty:
        return Verdict(path.name, "stale", f"measured uncommitted changes on {_short(commit)}: {', '.join(dirty[:3])}")
    later = _changed_after(paths, commit)
    if later:
        return Verdict(path.name, "stale", f"measured {_short(commit)}; the code it measures changed since: {later}")
    load = (stamp.get("load") or {}).get("max_1m")
    return Verdict(path.name, "fresh", f"measured {_short(commit)}{' (dirty: outputs only)' if stamp.get('dirty') else ''}"
                                       f", load at most {load}")


def structure_problems(path: Path) -> list[str]:
    """What CI checks of a result file (no timing): it reads, and its stamp has every key (a legacy one: the
    commit that last changed it)."""
    try:
        res = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return [f"{path.name}: unreadable ({e})"]
    stamp = res.get("stamp") if isinstance(res, dict) else None
    if not isinstance(stamp, dict):
        return [f"{path.name}: no stamp (commit, dirty, host, load): write it through bench.common (finish/stamped)"]
    if stamp.get("legacy"):
        return [] if stamp.get("committed_in") else [f"{path.name}: a legacy stamp names the commit it came in"]
    missing = [k for k in STAMP_KEYS if k not in stamp]
    return [f"{path.name}: stamp lacks {', '.join(missing)}"] if missing else []


def _within(old: float, new: float, noise: tuple[str, float]) -> bool:
    kind, tol = noise
    allowed = tol * abs(old) if kind == "rel" else tol
    return abs(new - old) <= allowed + 1e-12


def rerun(name: str) -> list[list[Any]]:
    """The cheap benchmark `name` run again: per goal, the recorded value, the new one, the noise and the verdict."""
    mod = importlib.import_module(f"bench.{name}")
    recorded = json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))
    old = {g["what"]: g["value"] for g in recorded.get("goals", [])}
    stamp = Stamp()
    t0 = time.perf_counter()
    res: Result = mod.run(**mod.CHECK)
    load = stamp.end()["load"]
    print(f"  {name}: re-run in {time.perf_counter() - t0:.0f} s, load {load['start'][0]} -> {load['end'][0]} "
          f"(at most {load['max_1m']})", flush=True)
    rows = []
    for g in res.goals:
        noise = mod.NOISE.get(g.what)
        if noise is None or g.what not in old:
            continue
        ok = _within(old[g.what], g.value, noise)
        rows.append([name, g.what, old[g.what], g.value, f"{noise[0]} {noise[1]:g}", "reproduces" if ok else "DIFFERS"])
    return rows


def check(rerun_cheap: bool = True) -> int:
    """Print every result's verdict (and the cheap benchmarks' re-runs); 1 if any is stale, unstamped or differs."""
    verdicts = [verdict(p) for p in result_files()]
    width = max(len(v.file) for v in verdicts)
    for v in verdicts:
        print(f"{v.file:<{width}}  {v.state:<9}  {v.why}")
    bad = [v for v in verdicts if v.state in ("stale", "unstamped")]
    differs = []
    if rerun_cheap:
        cheap = [n for n in (module_of(p) for p in result_files()) if n and _has_check(n)]
        print(f"\nre-running the cheap benchmarks ({', '.join(cheap)}); nothing is written")
        for name in dict.fromkeys(cheap):
            for row in rerun(name):
                print("  " + "  ".join(fmt(c, 4) for c in row))
                differs += [row] if row[-1] != "reproduces" else []
    print(f"\n{len(verdicts) - len(bad)} of {len(verdicts)} results describe the code as it is"
          + (f"; {len(differs)} figure(s) differ beyond their noise" if differs else ""))
    if bad:
        print("to measure them again (on a quiet machine), the commands that wrote them:")
        for cmd in dict.fromkeys(_command(RESULTS / v.file) for v in bad):
            print(f"  {cmd}")
    return 1 if bad or differs else 0


def _command(path: Path) -> str:
    """The command a result records (a `Result`'s), else the module's (its docstring gives the arguments)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if cmd := json.loads(path.read_text(encoding="utf-8")).get("command"):
            return str(cmd)
    name = module_of(path) or path.stem
    return f"python -m bench {name}" if name in BENCHMARKS else f"python -m bench.{name}  (arguments: its docstring)"


def _has_check(module: str) -> bool:
    tree = ast.parse((BENCH / f"{module}.py").read_text(encoding="utf-8"))
    return any(isinstance(node, ast.Assign | ast.AnnAssign) and any(
        isinstance(t, ast.Name) and t.id == "CHECK" for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))
        for node in tree.body)
