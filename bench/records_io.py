"""Reading and writing an output folder's `queries.jsonl`: the typed contract (pydantic) against a baseline
in the same run, on the same file.

`python -m bench.records_io OUT/queries.jsonl [--old WORKTREE] [--reps N]`. The baseline is raw `json` on
the same lines (what any typed reader must add to), and with `--old` also the release before the typed
contract, read from a git worktree of it (its hand-written `Record.from_dict`/`to_dict`). CPU time of this
process, median over alternating repetitions, so other work on the machine counts less.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from evaluator.results import schema


def _old_schema(worktree: Path) -> Any:
    """The release's `evaluator.results.schema`, imported under another package name beside this one."""
    pkg = Path(tempfile.mkdtemp(prefix="records-io-old-"))
    shutil.copytree(worktree / "evaluator", pkg / "evaluator_old")
    sys.path.insert(0, str(pkg))
    return importlib.import_module("evaluator_old.schema")


def _raw_read(folder: Path) -> list[dict[str, Any]]:
    with open(folder / schema.QUERIES_FILE, "rb") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _raw_write(folder: Path, rows: list[dict[str, Any]]) -> None:
    schema.atomic_write(folder / schema.QUERIES_FILE,
                     "".join(json.dumps(d, ensure_ascii=False, sort_keys=True) + "\n" for d in rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.records_io", description=__doc__.split("\n")[0])
    ap.add_argument("records", type=Path, help="a queries.jsonl, e.g. of `python -m evaluator --model sim --runs 4`")
    ap.add_argument("--old", type=Path, help="a git worktree of the release to compare with")
    ap.add_argument("--reps", type=int, default=8)
    args = ap.parse_args(argv)
    ways: dict[str, tuple[Any, Any]] = {
        "raw json": (_raw_read, _raw_write),
        "typed (this tree)": (lambda d: schema.OutputDir(d).read_records(), lambda d, r: schema.OutputDir(d).write_records(r)),
    }
    if args.old:
        old = _old_schema(args.old)
        ways["release (--old)"] = (lambda d: old.OutputDir(d).read_records(), lambda d, r: old.OutputDir(d).write_records(r))
    work = Path(tempfile.mkdtemp(prefix="records-io-"))
    times: dict[str, dict[str, list[float]]] = {w: {"read": [], "write": []} for w in ways}
    same: dict[str, bool] = {}
    for rep in range(args.reps):
        for name in (list(ways) if rep % 2 == 0 else list(reversed(ways))):
            folder = work / name.split()[0]
            folder.mkdir(exist_ok=True)
            shutil.copy(args.records, folder / schema.QUERIES_FILE)
            read, write = ways[name]
            t = time.process_time()
            rows = read(folder)
            times[name]["read"].append(time.process_time() - t)
            t = time.process_time()
            write(folder, rows)
            times[name]["write"].append(time.process_time() - t)
            same[name] = (folder / schema.QUERIES_FILE).read_bytes() == args.records.read_bytes()
            del rows
    n = sum(1 for line in args.records.open("rb") if line.strip())
    base = {k: statistics.median(times["raw json"][k]) for k in ("read", "write")}
    print(f"{n:,} records, {args.records.stat().st_size / 1e6:.1f} MB, {args.reps} repetitions, CPU s (median)")
    print(f"{'':20} {'read':>7} {'write':>7} {'r+w':>7}  vs raw json (r+w)  bytes")
    for name, t in times.items():
        r, w = statistics.median(t["read"]), statistics.median(t["write"])
        print(f"{name:20} {r:7.3f} {w:7.3f} {r + w:7.3f}  {(r + w) / (base['read'] + base['write']):17.2f}  "
              f"{'identical' if same[name] else 'DIFFERENT'}")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
