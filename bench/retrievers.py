"""Retrievers' cost over the full registry: BM25 index build (and its cache read), search by dense, bm25 and
hybrid, as ratios within one run (rounds alternate the three, medians reported), with RtP recall@5 beside.

    python -m bench.retrievers [--cache-dir DIR] [--rounds N]

Dense search is `VectorIndex.exact_search` of the already embedded queries (embedding them is a cache read
on a warm run); bm25 is `BM25Index.search` of the query texts (tokenising included); hybrid is both to the
fusion depth (100) plus the fusion, its dense side reading the query vectors from the embedding cache as a
run does (a fresh retriever each round, so no in-memory search memo answers it). The load average is recorded at start and end: on a shared machine the
figures are indicative and must be re-measured on a quiet one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from evaluator.analysis.metrics import recall
from evaluator.retrieval.lexical import BM25Index, load_index
from evaluator.retrieval.retrievers import FUSION_DEPTH, Dense, Hybrid, Lexical
from evaluator.settings.load import load_settings
from evaluator.study.prepare import load_inputs, prepare

from .common import PROJECT_CACHE, Result, Stamp, finish

TITLE = "Retrievers: BM25 index build and search, hybrid beside dense (full registry)"
K = 20
MEASURES = ("evaluator/retrieval", "bench/retrievers.py")  # the code it measures (`python -m bench --check`)

def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run(cache_dir: Path = PROJECT_CACHE, rounds: int = 5) -> Result:
    load0 = os.getloadavg()[0]
    s = load_settings()
    inputs = load_inputs(s.data)
    study = prepare(inputs, embed=s.embed, retrieval=s.retrieval, run=s.run, cache_root=cache_dir, progress=False)
    texts = study.registry.texts()
    queries = [q.text for q in study.queries]
    builds = [_time(lambda: BM25Index.build(texts)) for _ in range(max(2, rounds // 2))]
    with tempfile.TemporaryDirectory() as tmp:
        load_index(texts, Path(tmp))
        reads = [_time(lambda tmp=tmp: load_index(texts, Path(tmp))) for _ in range(3)]
    lexical = Lexical(BM25Index.build(texts))
    dense = Dense(study.embedder, study.index)
    hybrid = Hybrid(dense, lexical)
    qv = study.query_vecs
    runs = {"dense": lambda: study.index.exact_search(qv, K), "bm25": lambda: lexical.search(queries, K),
            # a fresh dense side each time: its in-memory search memo would otherwise answer every later round
            "hybrid": lambda: Hybrid(Dense(study.embedder, study.index), lexical).search(queries, K)}
    times: dict[str, list[float]] = {n: [] for n in runs}
    for i in range(rounds):  # alternated, the order rotated each round
        names = list(runs)[i % 3:] + list(runs)[: i % 3]
        for n in names:
            times[n].append(_time(runs[n]))
    med = {n: statistics.median(v) for n, v in times.items()}
    gold = [set(q.gold["api_list"]) for q in study.queries]
    rec: dict[str, float] = {}
    for name, r in (("dense", dense), ("bm25", lexical), ("hybrid", hybrid)):
        _, rows = r.search(queries, 5) if name != "dense" else study.index.exact_search(qv, 5)
        rec[name] = statistics.fmean(recall([study.registry.ids[x] for x in row], g) for row, g in zip(rows, gold, strict=True))
    load1 = os.getloadavg()[0]
    n = len(queries)
    rows_out = [
        ["BM25 index build (tokenise + weights)", f"{statistics.median(builds):.2f} s", "", ""],
        ["BM25 index read from the cache", f"{statistics.median(reads):.3f} s",
         f"{statistics.median(reads) / statistics.median(builds):.3f} x build", ""],
    ] + [[f"search {n} queries, top-{K}: {name}", f"{med[name]:.3f} s", f"{med[name] / med['dense']:.2f} x dense",
          f"{rec[name]:.3f}"] for name in runs]
    return Result(
        name="retrievers", title=TITLE, columns=["step", "median", "ratio", "RtP recall@5 (api_list, all subsets)"],
        rows=rows_out,
        notes=[f"{len(texts):,} APIs, {n} queries; {rounds} alternated rounds; hybrid = dense and BM25 each to "
               f"top-{FUSION_DEPTH}, RRF (60).",
               f"Load average (1 min): {load0:.2f} at start, {load1:.2f} at end, on a machine shared with other "
               "work: re-measure on a quiet machine before quoting the seconds; the ratios are the result."],
        data={"builds_s": builds, "reads_s": reads, "search_s": times, "recall5": rec, "load": [load0, load1],
              "apis": len(texts), "queries": n})


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.retrievers", description=__doc__.split("\n")[0])
    ap.add_argument("--cache-dir", type=Path, default=PROJECT_CACHE, help="embedding cache (read; default cache/)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    st = Stamp()
    t = time.perf_counter()
    r = run(args.cache_dir, args.rounds)
    finish(r, t, st, "bench.retrievers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
