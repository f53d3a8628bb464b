"""Benchmark: memory and output size as the number of records grows (issue 31, item 9), on generated data.

A small real study (examples/mcp, `--model sim --runs 2`) gives the template records; each is copied under new
query ids to N records in one subset per template subset, and `python -m evaluator report OUT` (the summary, the
tests, the report, the figures and view.html, from the saved data alone: no embedding, no LLM) runs on them as a
subprocess whose peak RSS is sampled every 50 ms, for each N in `SIZES`. What it reports is a ratio within one run
of the benchmark: the extra peak memory per extra record between the smallest and the largest N, and what that
slope projects for 100,000 queries x 4 runs x 2 models; beside it the largest file of the viewer (view.html or one
of its parts) at each N, which must not grow with N once the page is paged (`evaluator.render.view.PART_RECORDS`).
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
TITLE = "Scale: peak memory per record and the viewer's largest file as records grow (generated data)"
SIZES = (6_000, 24_000)
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


def run() -> Result:
    rows, data = [], {}
    with temp_dir("scale") as tmp:
        template = _template(tmp)
        for n in SIZES:
            out = OutputDir(tmp / f"out-{n}")
            records = synthesise(template, out, n)
            t0 = time.perf_counter()
            with open(tmp / f"log-{n}", "wb") as fh:
                proc = subprocess.Popen([PYTHON, "-m", "evaluator", "report", str(out.path)], cwd=REPO, stdout=fh,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                with TreeRSS(proc.pid) as rss:
                    rc = proc.wait()
            if rc != 0:
                raise RuntimeError(f"report exited with {rc}:\n{(tmp / f'log-{n}').read_text()[-2000:]}")
            largest, n_parts = _largest_view_file(out.path)
            data[str(n)] = {"peak_bytes": rss.peak, "records": records, "largest_view_file": largest,
                            "parts": n_parts, "queries_jsonl_bytes": (out.path / "queries.jsonl").stat().st_size,
                            "wall_s": time.perf_counter() - t0}
            rows.append([records, round(rss.peak / 2**20), round(largest / 2**10), n_parts,
                         round(data[str(n)]["queries_jsonl_bytes"] / 2**20, 1), round(data[str(n)]["wall_s"], 1)])
    lo, hi = data[str(SIZES[0])], data[str(SIZES[-1])]
    per_record = (hi["peak_bytes"] - lo["peak_bytes"]) / (hi["records"] - lo["records"])
    projected_gib = (lo["peak_bytes"] + per_record * (PROJECTED - lo["records"])) / 2**30
    view_ratio = hi["largest_view_file"] / lo["largest_view_file"]
    return Result(
        name=NAME, title=TITLE,
        columns=["records", "peak RSS MiB (report)", "largest viewer file KiB", "view parts", "queries.jsonl MiB",
                 "wall s"],
        rows=rows,
        goals=[Goal(f"largest viewer file at {hi['records']:,} / at {lo['records']:,} records", view_ratio, "<= 1.2",
                    view_ratio <= 1.2)],
        notes=[f"extra peak memory per extra record: {per_record / 2**10:.1f} KiB; projected for {PROJECTED:,} records "
               f"(100k queries x 4 runs x 2 models): {projected_gib:.2f} GiB",
               "records: a sim study of examples/mcp (2 runs) copied under new query ids; `python -m evaluator report`"],
        data={"sizes": data, "per_record_bytes": per_record, "projected_gib": projected_gib},
    )


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--data":
    print(make_data(Path(sys.argv[2]), int(sys.argv[3])))
