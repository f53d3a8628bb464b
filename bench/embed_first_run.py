"""Benchmark: a fresh clone's first run, `python -m evaluator --retrieval-only` with an empty cache.

Two runs back to back, each with its own empty --cache-dir (so each embeds the whole 47k registry
from scratch): the code as it was before the embedding backends (`--before`, default commit 2acddc3,
unpacked with `git archive` into a temporary folder and run there with the same virtualenv; its
default on a CPU was torch fp32) and the working tree's default (`--backend auto`).
Reported: wall time of each and their ratio, and the largest difference between their RtP figures
(every RtP row of summary.json: recall, precision, miss per subset, gold set and k). Beside them, the
compute floor of any fp32 path on this machine: the forward passes' multiply-adds over the texts'
real tokens (no padding), from the model's config, at the rate this machine's BLAS reaches on the
model's own matrix shape (numpy float32, every CPU) — so the best ratio any exact path could reach
here is the old run's wall over that floor. Not part of `python -m bench` (about 2 x 5
minutes on 2 quiet cores).

    python -m bench.embed_first_run [--order auto-first]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from .common import REPO, Goal, Result, checkout, data_dir, run_cli

NAME = "embed_first_run"
TITLE = "First run of a fresh clone (--retrieval-only, empty cache): now (auto) vs before (torch fp32)"
BEFORE = "2acddc3"  # the last commit before the embedding backends
RUNS = ("before: torch fp32", "now: auto (default)")


def _rtp_figures(summary: dict[str, Any]) -> dict[str, float]:
    """(subset, gold, metric, k) -> mean, for every RtP row of summary.json."""
    return {f"{r.get('subset')}|{r.get('gold')}|{r.get('metric')}@{r.get('k')}": float(r["mean"])
            for r in summary.get("rows", []) if r.get("arch") == "rtp" and r.get("mean") is not None}


def _top5(out: Path) -> dict[str, list[str]]:
    """(subset, query id) -> the RtP top-5 list the run saved, from queries.jsonl."""
    tops = {}
    for line in (out / "queries.jsonl").read_bytes().splitlines():
        r = orjson.loads(line)
        if r.get("rtp"):
            tops[f"{r['subset']}|{r['query_id']}"] = list(r["rtp"]["retrieved"][:5])
    return tops


def _run(code: Path, work: Path) -> tuple[float, dict[str, Any]]:
    cache, out = work / "cache", work / "out"
    wall, _ = run_cli(code, ["--retrieval-only", "--no-progress", "--data", data_dir(), "--cache-dir", str(cache),
                             "--out", str(out)])
    summary = orjson.loads((out / "summary.json").read_bytes())
    meta = orjson.loads((out / "meta.json").read_bytes()) if (out / "meta.json").exists() else {}
    return wall, {"summary": summary, "meta": meta, "top5": _top5(out)}


def _texts() -> list[str]:
    """What a first run embeds: the registry's texts and the test queries."""
    from evaluator.data import load_registry
    from evaluator.data.queries import find_query_files, read_query_file

    texts = load_registry(data_dir()).texts()
    for f in find_query_files(Path(data_dir())):
        texts += [q.text for q in read_query_file(f)]
    return list(dict.fromkeys(texts))


def compute_floor() -> dict[str, float]:
    """Seconds of fp32 arithmetic a first run cannot avoid here: 2 x multiply-adds per real token
    (the 6 layers' projections and feed-forward, and attention over the text's own length), at the
    best sgemm rate numpy reaches here on the model's shapes (4,096 tokens through the feed-forward and
    the projections) or on a square 2,048 product (BLAS's best case)."""
    import json

    import numpy as np
    from tokenizers import Tokenizer

    from evaluator.core import threads
    from evaluator.embed import DEFAULT_MODEL, resolve_model

    threads.configure_env()
    root = Path(resolve_model(DEFAULT_MODEL)[0])
    cfg = json.loads((root / "config.json").read_text())
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    tk = Tokenizer.from_file(str(root / "tokenizer.json"))
    tk.no_padding()
    tk.enable_truncation(256)  # the model's max_seq_length (sentence_bert_config.json)
    lens = np.array([len(e.ids) for e in tk.encode_batch(_texts())], dtype=np.float64)
    per_token = 2 * layers * (4 * h * h + 2 * h * inter)  # Q, K, V, output; feed-forward up and down
    attention = 2 * layers * 2 * h * lens  # scores and weighted values, per token, over its own text
    flops = float(np.sum(lens * per_token + lens * attention))
    rates = {}
    for m, kk, n in ((4096, h, inter), (4096, inter, h), (4096, h, h), (2048, 2048, 2048)):
        a = np.random.default_rng(0).standard_normal((m, kk)).astype(np.float32)
        b = np.random.default_rng(1).standard_normal((kk, n)).astype(np.float32)
        a @ b  # warm the BLAS threads
        t0, reps = time.perf_counter(), max(3, int(2e10 // (2 * m * kk * n)))
        for _ in range(reps):
            a @ b
        rates[f"{m}x{kk}@{kk}x{n}"] = reps * 2 * m * kk * n / (time.perf_counter() - t0) / 1e9
    rate = max(rates.values()) * 1e9
    return {"texts": float(len(lens)), "tokens": float(lens.sum()), "tflop": flops / 1e12,
            "sgemm_gflops": rate / 1e9, "sgemm_gflops_by_shape": rates, "floor_s": flops / rate}


def run(order: list[str] | None = None, before: str = BEFORE) -> Result:
    order = order or list(RUNS)
    walls: dict[str, float] = {}
    sums: dict[str, dict[str, float]] = {}
    metas: dict[str, Any] = {}
    tops: dict[str, dict[str, list[str]]] = {}
    for name in order:
        work = Path(tempfile.mkdtemp(prefix="bench-first-run-"))
        try:
            code = REPO
            if name == RUNS[0]:
                (work / "code").mkdir()
                code = checkout(before, work / "code")
            walls[name], got = _run(code, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        sums[name] = _rtp_figures(got["summary"])
        tops[name] = got["top5"]
        metas[name] = {k: got["meta"].get(k) for k in ("embedder", "backend", "precision")}
        metas[name]["timings"] = got["meta"].get("runtime", {}).get("timings") or got["meta"].get("timings")
        metas[name]["embed"] = got["meta"].get("runtime", {}).get("embed")
    ref, new = RUNS
    common = sorted(set(sums[ref]) & set(sums[new]))
    diff = max((abs(sums[ref][k] - sums[new][k]) for k in common), default=float("nan"))
    shared = sorted(set(tops[ref]) & set(tops[new]))
    same_list = sum(tops[ref][q] == tops[new][q] for q in shared) / max(len(shared), 1)
    same_set = sum(set(tops[ref][q]) == set(tops[new][q]) for q in shared) / max(len(shared), 1)
    speed = walls[ref] / walls[new]
    rows = [[n, round(walls[n], 1), round(walls[ref] / walls[n], 2)] for n in RUNS]
    floor = compute_floor()
    ffn = floor["sgemm_gflops_by_shape"]["4096x384@384x1536"]
    floor["floor_model_shape_s"] = floor["tflop"] * 1e3 / ffn
    rows += [["fp32 arithmetic alone at sgemm's rate on the model's feed-forward shape (no run)",
              round(floor["floor_model_shape_s"], 1), round(walls[ref] / floor["floor_model_shape_s"], 2)],
             ["fp32 arithmetic alone at sgemm's best rate here, square 2,048 (no run)", round(floor["floor_s"], 1),
              round(walls[ref] / floor["floor_s"], 2)]]
    return Result(
        extra_tables=[_breakdown(walls, metas)],
        name=NAME, title=TITLE, columns=["run", "wall s", "speed vs before"], rows=rows,
        goals=[Goal("first run: before's wall / now's wall", speed, ">= 2.5", speed >= 2.5),
               Goal("max |RtP figure difference| vs before", diff, "<= 0.005", diff <= 0.005),
               Goal("queries whose RtP top-5 list (order included) equals before's", same_list, ">= 0.98",
                    same_list >= 0.98)],
        notes=[f"order: {', '.join(order)}; each with its own empty --cache-dir; 'before' = commit {before}; "
               f"{len(common)} RtP figures of summary.json compared; top-5 of {len(shared)} queries compared "
               f"(identical lists {same_list:.4f}, identical sets {same_set:.4f})",
               f"floor: {floor['texts']:,.0f} texts, {floor['tokens']:,.0f} real tokens, {floor['tflop']:.1f} TFLOP of "
               f"fp32 forward passes, at numpy sgemm's rate on the model's feed-forward shape ({ffn:.0f} GFLOP/s) and on "
               f"a square 2,048 product ({floor['sgemm_gflops']:.0f} GFLOP/s), measured after the runs; the whole "
               f"command at 2.5x would have to finish in {walls[ref] / 2.5:.0f} s, tokenising, export and writes included",
               "the machine is shared: see loadavg at start and end"],
        data={"wall_s": walls, "max_rtp_diff": diff, "figures_compared": len(common), "meta": metas,
              "top5_identical_lists": same_list, "top5_identical_sets": same_set, "top5_queries": len(shared),
              "before": before, "floor": floor},
    )


_PARTS = (("model_load_s", "import torch + load the model"), ("export_s", "export + compile the runtime"),
          ("tokenize_s", "tokenize"), ("infer_s", "forward passes"))


def _breakdown(walls: dict[str, float], metas: dict[str, Any]) -> dict[str, Any]:
    """Where each run's seconds went, from its meta.json (the embedder's own timings where it has
    them; 'before' records only the embed stage's total)."""
    rows = []
    for name in RUNS:
        t = metas[name].get("timings") or {}
        e = metas[name].get("embed") or {}
        parts = [round(float(e[k]), 1) if k in e else None for k, _ in _PARTS]
        embed = float(t.get("embed_s", 0.0))
        rest = walls[name] - embed - float(t.get("load_s", 0.0)) - float(t.get("rtp_search_s", 0.0))
        rows.append([name, round(walls[name], 1), round(float(t.get("load_s", 0.0)), 1), round(embed, 1), *parts,
                     round(rest, 1)])
    return {"title": "where the seconds go (meta.json runtime timings)",
            "columns": ["run", "wall s", "load data", "embed stage", *[label for _, label in _PARTS],
                        "start-up, imports, render, writes"], "rows": rows}


def main() -> None:
    from .common import machine, print_result, write_result

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", choices=["before-first", "now-first"], default="before-first")
    ap.add_argument("--before", default=BEFORE, help="the commit to compare with (default %(default)s)")
    a = ap.parse_args()
    order = list(RUNS) if a.order == "before-first" else list(reversed(RUNS))
    t0 = time.perf_counter()
    m = machine()
    r = run(order, a.before)
    r.seconds = time.perf_counter() - t0
    r.machine = m | {"loadavg_1m_end": round(os.getloadavg()[0], 2)}
    r.command = "python -m bench.embed_first_run " + " ".join(sys.argv[1:])
    print_result(r)
    write_result(r)


if __name__ == "__main__":
    main()
