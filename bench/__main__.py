"""`python -m bench [NAME ...]`: run the benchmarks (all by default), print tables, write JSON.

Each benchmark writes `bench/results/<name>.json`, stamped with the commit it measured (and whether the tree was
dirty), the host's CPU and the load before, during and after (`common.Stamp`); afterwards the results block of
`bench/README.md` is regenerated from every JSON present, so the README always shows the latest run.
`python -m bench --check` says which results are older than the code they measure and re-runs the cheap
benchmarks against what they recorded (`bench/check.py`); it writes nothing.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback

# The tokenizer's own thread pool would compete with torch and FAISS for the 2 cores.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from .common import BENCHMARKS  # noqa: E402  (after the tokenizer setting)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run (default all): {', '.join(BENCHMARKS)}")
    ap.add_argument("--no-readme", action="store_true", help="do not regenerate bench/README.md's results")
    ap.add_argument("--check", action="store_true", help="which results are stale; re-run the cheap benchmarks and "
                    "compare with their results (writes nothing)")
    ap.add_argument("--no-rerun", action="store_true", help="with --check: the git comparison only")
    args = ap.parse_args(argv)
    if args.check:
        from .check import check

        return check(rerun_cheap=not args.no_rerun)
    names = args.names or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")

    from .common import Stamp, finish
    from .readme import update_readme

    failed = []
    t_all = time.perf_counter()
    for name in names:
        mod = importlib.import_module(BENCHMARKS[name])
        print(f"\n=== {mod.TITLE}", flush=True)
        t0 = time.perf_counter()
        stamp = Stamp()
        try:
            result = mod.run()
        except Exception:
            stamp.end()
            traceback.print_exc()
            failed.append(name)
            continue
        print(f"wrote {finish(result, t0, stamp, BENCHMARKS[name], f'python -m bench {name}')}", flush=True)
    print(f"\nall done in {time.perf_counter() - t_all:.0f} s" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    if not args.no_readme:
        update_readme()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
