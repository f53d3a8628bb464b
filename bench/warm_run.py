"""Benchmark: the warm rerun of the whole study, as a researcher reruns it many times a day.

`python -m evaluator --model sim --runs 4` with every embedding and every reply already cached, run
N times as a user runs it (a new process, a new output folder each time), beside the warm
`--retrieval-only` command. Reported: wall time of each (median and every run), each stage's share of
the full run from the timings the run writes into `meta.json` (`runtime.timings`: load, embed,
rtp_search, llm, scaling, routing, render; "start-up and the rest" is the wall time less their sum:
interpreter start, imports, the simulator's start and stop, writing the outputs), the import time of
the command alone (`python -m evaluator --help`), and whether every timed run's summary.json and
queries.jsonl are byte-identical to the first (untimed) run's, and to `--reference`'s when given, and
its scaling.json and routing.json equal but for their `meta.timing_s`.

The cache is a temporary folder: the project's embedding shards linked (never written), the LLM
replies copied from the project's cache (`cache/llm`, SQLite's backup API), then one untimed priming
run that fills whatever is still missing (replies from the bundled simulator; the figure store).
`--before REV` times the same commands in a checkout of REV (`git archive`) on the same cache, one
after the other with the working tree's runs, for a before/after ratio measured under the same load.

    python -m bench.warm_run [--runs 3] [--before REV] [--reference /work/baseline/full]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from .common import PROJECT_CACHE, REPO, Goal, Result, checkout, data_dir, link_embeddings, run_cli

NAME = "warm_run"
MEASURES = ("evaluator", "simulator", "bench/warm_run.py")  # the code it measures (`python -m bench --check`)
TITLE = "Warm rerun of the whole study (--model sim --runs 4, everything cached) and of --retrieval-only"
STUDY_ARGS = ["--model", "sim", "--runs", "4"]
STAGES = ("load_s", "embed_s", "rtp_search_s", "llm_s", "scaling_s", "routing_s", "render_s")
COMPARED = ("summary.json", "queries.jsonl", "scaling.json", "routing.json")
TARGET_S = 3.0


def _copy_llm_cache(src: Path, dst: Path) -> bool:
    """The project's reply cache copied consistently (SQLite backup), or False when it has none."""
    db = src / "llm" / "cache.db"
    if not db.is_file():
        return False
    (dst / "llm").mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as a, sqlite3.connect(dst / "llm" / "cache.db") as b:
        a.backup(b)
    return True


def _run(code: Path, args: list[str], cache: Path, out: Path) -> tuple[float, dict[str, Any]]:
    wall, cpu = run_cli(code, [*args, "--no-progress", "--data", data_dir(), "--cache-dir", str(cache), "--out", str(out)])
    meta = orjson.loads((out / "meta.json").read_bytes())
    return wall, (meta.get("runtime", {}).get("timings") or {}) | {"cpu_s": cpu}


def _help_wall(code: Path) -> float:
    """`python -m evaluator --help`: interpreter start and every import the command makes."""
    return run_cli(code, ["--help"])[0]


def _content(path: Path) -> bytes | dict[str, Any] | None:
    """A file's bytes; for the analyses' JSON, its value less `meta.timing_s` (each run's own seconds)."""
    if not path.is_file():
        return None
    if path.suffix != ".json" or path.name == "summary.json":
        return path.read_bytes()
    value = json.loads(path.read_text())  # the analyses write NaN, which orjson does not read
    value.get("meta", {}).pop("timing_s", None)
    return value


def _numbers(path: Path) -> Any:
    """summary.json less its `meta` (the settings echoed, which other changes may extend)."""
    if not path.is_file():
        return None
    return {k: v for k, v in json.loads(path.read_text()).items() if k != "meta"}


def _same(a: Path, b: Path) -> dict[str, bool]:
    """Per compared file: equal bytes (summary.json, queries.jsonl) or equal values but for timings;
    and summary.json's numbers (rows, tests, checks) apart from its meta."""
    out = {f: _content(a / f) is not None and _content(a / f) == _content(b / f) for f in COMPARED}
    out["summary.json numbers"] = _numbers(a / "summary.json") is not None and \
        _numbers(a / "summary.json") == _numbers(b / "summary.json")
    return out


def run(runs: int = 3, before: str | None = None, reference: Path | None = None) -> Result:
    work = Path(tempfile.mkdtemp(prefix="bench-warm-run-"))
    try:
        cache = work / "cache"
        linked = link_embeddings(cache)
        copied = _copy_llm_cache(PROJECT_CACHE, cache)
        codes = {"now": REPO}
        if before:
            codes["before"] = checkout(before, work / "before")
        # Priming: fills what the project's cache lacks (and the figure store), warms the page cache.
        prime = {}
        for name, code in codes.items():
            prime[name] = work / f"prime-{name}"
            _run(code, STUDY_ARGS, cache, prime[name])
            _run(code, ["--retrieval-only"], cache, work / f"prime-ro-{name}")
        walls: dict[str, dict[str, list[float]]] = {
            n: {k: [] for k in ("study", "study_cpu", "retrieval_only", "retrieval_only_cpu", "help")} for n in codes}
        timings: dict[str, list[dict[str, float]]] = {n: [] for n in codes}
        same: dict[str, list[dict[str, bool]]] = {n: [] for n in codes}
        for i in range(runs):
            order = list(codes) if i % 2 == 0 else list(reversed(codes))  # alternate: drift hits both alike
            for name in order:
                code = codes[name]
                out = work / f"{name}-{i}"
                wall, t = _run(code, STUDY_ARGS, cache, out)
                walls[name]["study"].append(wall)
                walls[name]["study_cpu"].append(t["cpu_s"])
                timings[name].append(t)
                same[name].append(_same(out, prime[name]))
                wall, t = _run(code, ["--retrieval-only"], cache, work / f"{name}-ro-{i}")
                walls[name]["retrieval_only"].append(wall)
                walls[name]["retrieval_only_cpu"].append(t["cpu_s"])
                walls[name]["help"].append(_help_wall(code))
                shutil.rmtree(out, ignore_errors=True)
        ref_same = _same(prime["now"], reference) if reference else None
        before_same = _same(prime["now"], prime["before"]) if before else None
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {n: {k: statistics.median(v) for k, v in w.items()} for n, w in walls.items()}
    now = med["now"]
    stage_med = {s: statistics.median([t.get(s, 0.0) for t in timings["now"]]) for s in STAGES}
    rest = now["study"] - sum(stage_med.values())
    rows = [[s.removesuffix("_s"), round(v, 2), round(100 * v / now["study"], 1)] for s, v in stage_med.items()]
    rows.append(["start-up and the rest (imports, simulator, writes)", round(rest, 2), round(100 * rest / now["study"], 1)])
    rows.append(["whole command (median wall)", round(now["study"], 2), 100.0])
    cmds = [["study: --model sim --runs 4, wall", *[round(med[n]["study"], 2) for n in codes]],
            ["study, CPU (user + sys, with the simulator)", *[round(med[n]["study_cpu"], 2) for n in codes]],
            ["--retrieval-only, wall", *[round(med[n]["retrieval_only"], 2) for n in codes]],
            ["--retrieval-only, CPU", *[round(med[n]["retrieval_only_cpu"], 2) for n in codes]],
            ["--help (start-up and imports), wall", *[round(med[n]["help"], 2) for n in codes]]]
    identical = all(all(d.values()) for d in same["now"])
    goals = [Goal("warm study wall (median, s)", now["study"], f"<= {TARGET_S:g}", now["study"] <= TARGET_S),
             Goal("outputs identical across reruns", float(identical), "== 1", identical)]
    if ref_same is not None:
        # The rows, tests, records and analyses; summary.json's `meta` echoes the settings, which grow
        # with new profile fields, so its bytes are reported in the notes but not required.
        same_rows = all(v for f, v in ref_same.items() if f != "summary.json")
        goals.append(Goal(f"results identical to {reference} (summary rows/tests, queries, scaling, routing)",
                          float(same_rows), "== 1", same_rows))
    if before:
        speed = med["before"]["study"] / now["study"]
        goals.append(Goal(f"warm study: {before}'s wall / now's", speed, ">= 1", speed >= 1))
        cpu = med["before"]["study_cpu"] / now["study_cpu"]
        goals.append(Goal(f"warm study: {before}'s CPU seconds / now's", cpu, ">= 1", cpu >= 1))
    notes = [f"{runs} timed runs of each command, alternating with --before's; cache: {linked} embedding shards "
             f"linked, LLM replies {'copied from cache/llm' if copied else 'from the priming run (simulator)'}",
             "stage seconds are medians of meta.json runtime.timings; the machine is shared: see loadavg"]
    if before_same is not None:
        notes.append(f"outputs identical to {before}'s: {before_same}")
    if ref_same is not None:
        notes.append(f"outputs vs {reference}: {ref_same}")
    return Result(
        name=NAME, title=TITLE, columns=["stage of the warm study", "seconds (median)", "% of wall"], rows=rows,
        extra_tables=[{"title": "commands, median seconds", "columns": ["command", *codes], "rows": cmds}],
        goals=goals, notes=notes,
        data={"walls": walls, "timings": timings, "identical": same, "identical_to_reference": ref_same,
              "identical_to_before": before_same, "before": before, "stage_median_s": stage_med},
    )


def main() -> None:
    from .common import Stamp, finish
    from .readme import update_readme

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="timed runs of each command (default %(default)s)")
    ap.add_argument("--before", help="also time the commands in a checkout of this commit, on the same cache")
    ap.add_argument("--reference", type=Path, help="an output folder of the same study to compare outputs with")
    ap.add_argument("--no-readme", action="store_true", help="do not regenerate bench/README.md's results")
    a = ap.parse_args()
    t0 = time.perf_counter()
    st = Stamp()
    r = run(a.runs, a.before, a.reference)
    finish(r, t0, st, "bench.warm_run")
    if not a.no_readme:
        update_readme()


if __name__ == "__main__":
    main()
