"""`python -m bench [NAME ...]`: run the benchmarks (all by default), print tables, write JSON.

Each benchmark writes `bench/results/<name>.json`; afterwards the results block of
`bench/README.md` is regenerated from every JSON present, so the README always shows the latest run.
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run (default all): {', '.join(BENCHMARKS)}")
    ap.add_argument("--no-readme", action="store_true", help="do not regenerate bench/README.md's results")
    args = ap.parse_args(argv)
    names = args.names or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")

    from .common import machine, print_result, write_result
    from .readme import update_readme

    failed = []
    t_all = time.perf_counter()
    for name in names:
        mod = importlib.import_module(BENCHMARKS[name])
        print(f"\n=== {mod.TITLE}", flush=True)
        t0 = time.perf_counter()
        info = machine()
        try:
            result = mod.run()
        except Exception:
            traceback.print_exc()
            failed.append(name)
            continue
        result.seconds = time.perf_counter() - t0
        result.machine = info | {"loadavg_1m_end": round(os.getloadavg()[0], 2)}
        result.command = f"python -m bench {name}"
        print_result(result)
        print(f"wrote {write_result(result)}", flush=True)
    print(f"\nall done in {time.perf_counter() - t_all:.0f} s" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    if not args.no_readme:
        update_readme()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
