"""Benchmark: memory and output size as the queries grow (issue 31, item 9), on generated data.

Two measurements, each at a small and a large size, as a user runs the commands (a subprocess whose tree's RSS
is sampled every 50 ms, the largest process reported):
- **study**: `python -m evaluator --data GEN --model sim --runs 1` (scaling and routing included) on N generated
  queries (`make_data`: 400 APIs, 3 subsets), each size its own queries (nothing of them cached) in one cache
  whose embedder export a 50-query run made first (the export's child process would be the largest otherwise). Its slope is what one more
  query costs the whole command; past `results.stream.held()` records the study spills them to disk and every
  analysis reads them as a stream.
- **report**: `python -m evaluator report OUT` on N records copied from a small real study (examples/mcp, 2
  runs) under new query ids: the summary, the tests, the report, the figures and view.html from the saved data.
What is reported are ratios within one run: the extra peak memory per extra record between the sizes and what
that slope projects for 100,000 queries x 4 runs x 2 models, beside the largest file of the viewer (view.html or
one of its parts), which must not grow once the page is paged (`evaluator.render.view_page.PART_RECORDS`).
`make_data` also writes a registry and N queries for a whole run (`python -m bench.scale --data DIR N`).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

from evaluator.results.schema import Meta, OutputDir, as_records, plain

from .common import PYTHON, REPO, Goal, Result, TreeRSS, temp_dir

NAME = "scale"
MEASURES = ("evaluator", "simulator", "bench/scale.py")  # the code it measures (`python -m bench --check`)
TITLE = "Scale: peak memory per record of the study and the report, the viewer's largest file (generated data)"
SIZES = (6_000, 30_000)  # records of the report
STUDY_SIZES = (10_000, 25_000)  # queries of the study (one model, one run: a record each)
# The stated bounds: extra peak memory per extra record of a report (streamed: ~0.6 KiB of it the summary's
# per-query values, traced; the rest the allocator's), and per extra query of a study (which also holds each
# query's text, gold, RtP list and vector, and its stubs' vectors in the embedding store: ~6 KiB).
SLOPE_KIB = 4.0
STUDY_SLOPE_KIB = 16.0
N_APIS = 400
PROJECTED = 100_000 * 4 * 2  # records of 100k queries, 4 runs, 2 models
WORDS = ["weather", "forecast", "currency", "convert", "stock", "quote", "football", "player", "transfer", "hotel", "search", "flight", "airport", "book", "train", "ticket", "recipe", "calories", "translate", "text", "news", "headline", "movie", "review", "music", "lyrics", "map", "route", "traffic", "parking", "restaurant", "menu", "order", "pizza", "email", "send", "calendar", "event", "reminder", "timer", "alarm", "crypto", "price", "wallet", "invoice", "pay", "tax", "vat", "shipping", "track", "parcel"]


def make_data(root: Path, n_queries: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    (root / "registry").mkdir(parents=True)
    apis = []
    for i in range(N_APIS):
        a, b, c = rng.sample(WORDS, 3)
        apis.append({"tool_name": f"{a.title()} {b.title()} {i // 4}", "api_name": f"{c} {a} {i}",
                     "category": "Generated", "api_description": f"{c.title()} the {a} {b} by {rng.choice(WORDS)}"})
    (root / "registry" / "apis.jsonl").write_text("".join(json.dumps(a) + "\n" for a in apis), encoding="utf-8")
    lines = []
    for q in range(n_queries):
        gold = rng.sample(apis, 2)
        words = " ".join(rng.sample(WORDS, 6))
        lines.append(json.dumps({"id": q, "subset": f"S{q % 3}", "query": f"Please {words} for case {q}",
                                 "gold": [f"{g['tool_name']}::{g['api_name']}" for g in gold]}))
    (root / "queries.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def _largest_view_file(out: Path) -> tuple[int, int]:
    """(bytes of the largest viewer file, number of part files)."""
    parts = list((out / "view-data").glob("part-*.js")) if (out / "view-data").is_dir() else []
    return max([(out / "view.html").stat().st_size, *(p.stat().st_size for p in parts)]), len(parts)


def _template(tmp: Path) -> OutputDir:
    out = tmp / "template"
    cmd = [PYTHON, "-m", "evaluator", "--data", str(REPO / "examples" / "mcp"), "--model", "sim", "--runs", "2",
           "--no-extras", "--cache-dir", str(tmp / "cache"), "--out", str(out), "--no-progress"]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
    return OutputDir(out)


def synthesise(src: OutputDir, dst: OutputDir, n: int) -> int:
    """About `n` records: the template's records copied under new query ids (every run of a query together)."""
    recs = [plain(r) for r in src.read_records()]
    per_copy = len(recs)
    out = []
    for c in range(max(1, round(n / per_copy))):
        out += [r | {"query_id": f"{r['query_id']}-{c}", "query": f"{r['query']} (copy {c})"} for r in recs]
    meta = plain(src.read_meta())
    meta["subsets"] = {s: v * max(1, round(n / per_copy)) for s, v in meta["subsets"].items()}
    meta["registry"].pop("digest", None)
    dst.path.mkdir(parents=True)
    dst.write_meta(Meta.from_dict(meta))
    return dst.write_records(as_records(out))


def _peak(cmd: list[str], log: Path) -> tuple[int, float]:
    """(peak RSS of the largest process of the command's tree, wall seconds)."""
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        with TreeRSS(proc.pid) as rss:
            rc = proc.wait()
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd[2:5])} exited with {rc}:\n{log.read_text()[-2000:]}")
    return rss.largest, time.perf_counter() - t0


def _study(tmp: Path, n: int, seed: int) -> dict[str, float]:
    data = make_data(tmp / f"data-{n}", n, seed)
    out = tmp / f"study-{n}"
    peak, wall = _peak([PYTHON, "-m", "evaluator", "--data", str(data), "--model", "sim", "--runs", "1",
                        "--cache-dir", str(tmp / "cache"), "--out", str(out), "--no-progress"], tmp / f"study-{n}.log")
    timings = json.loads((out / "meta.json").read_text())["runtime"]["timings"]
    return {"peak_bytes": peak, "records": n, "wall_s": wall, "routing_s": timings.get("routing_s", 0.0),
            "render_s": timings.get("render_s", 0.0)}


def _slope(lo: dict, hi: dict) -> tuple[float, float]:
    """(bytes per extra record, GiB projected for PROJECTED records)."""
    per = (hi["peak_bytes"] - lo["peak_bytes"]) / (hi["records"] - lo["records"])
    return per, (lo["peak_bytes"] + per * (PROJECTED - lo["records"])) / 2**30


def run() -> Result:
    rows, data, study = [], {}, {}
    with temp_dir("scale") as tmp:
        # The embedder's export first, on a few queries: in a fresh cache its child process (~0.9 GiB) would be
        # the largest process of both sizes. Each size then embeds and asks for its own queries.
        _study(tmp, 50, seed=99)
        for i, n in enumerate(STUDY_SIZES):
            st = study[str(n)] = _study(tmp, n, seed=i)
            rows.append(["study", n, round(st["peak_bytes"] / 2**20), "", "", "", round(st["wall_s"], 1)])
        template = _template(tmp)
        for n in SIZES:
            out = OutputDir(tmp / f"out-{n}")
            records = synthesise(template, out, n)
            peak, wall = _peak([PYTHON, "-m", "evaluator", "report", str(out.path)], tmp / f"log-{n}")
            largest, n_parts = _largest_view_file(out.path)
            data[str(n)] = {"peak_bytes": peak, "records": records, "largest_view_file": largest, "parts": n_parts,
                            "queries_jsonl_bytes": (out.path / "queries.jsonl").stat().st_size, "wall_s": wall}
            rows.append(["report", records, round(peak / 2**20), round(largest / 2**10), n_parts,
                         round(data[str(n)]["queries_jsonl_bytes"] / 2**20, 1), round(wall, 1)])
    lo, hi = data[str(SIZES[0])], data[str(SIZES[-1])]
    per_record, projected_gib = _slope(lo, hi)
    s_lo, s_hi = study[str(STUDY_SIZES[0])], study[str(STUDY_SIZES[-1])]
    per_query, study_gib = _slope(s_lo, s_hi)
    view_ratio = hi["largest_view_file"] / lo["largest_view_file"]
    return Result(
        name=NAME, title=TITLE,
        columns=["command", "records", "peak RSS MiB (largest process)", "largest viewer file KiB", "view parts",
                 "queries.jsonl MiB", "wall s"],
        rows=rows,
        goals=[Goal(f"largest viewer file at {hi['records']:,} / at {lo['records']:,} records", view_ratio, "<= 1.2",
                    view_ratio <= 1.2),
               Goal("report: extra peak KiB per extra record", per_record / 2**10, f"<= {SLOPE_KIB}",
                    per_record / 2**10 <= SLOPE_KIB),
               Goal("study: extra peak KiB per extra query (a record each)", per_query / 2**10,
                    f"<= {STUDY_SLOPE_KIB}", per_query / 2**10 <= STUDY_SLOPE_KIB)],
        notes=[f"report: {per_record / 2**10:.2f} KiB per extra record; projected for {PROJECTED:,} records "
               f"(100k queries x 4 runs x 2 models): {projected_gib:.2f} GiB",
               f"study: {per_query / 2**10:.2f} KiB per extra query; projected for {PROJECTED:,} records: "
               f"{study_gib:.2f} GiB (routing {s_lo['routing_s']:.1f} s at {STUDY_SIZES[0]:,}, "
               f"{s_hi['routing_s']:.1f} s at {STUDY_SIZES[-1]:,} queries)",
               "study: generated data (bench.scale.make_data), `--model sim --runs 1`, scaling and routing included, "
               "one cache (the embedder exported first), each size its own queries; report: a sim study of examples/mcp (2 runs) copied under new query ids"],
        data={"sizes": data, "study": study, "per_record_bytes": per_record, "projected_gib": projected_gib,
              "per_query_bytes_study": per_query, "projected_gib_study": study_gib},
    )


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--data":
    print(make_data(Path(sys.argv[2]), int(sys.argv[3])))
