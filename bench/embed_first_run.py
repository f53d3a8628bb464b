"""Benchmark: a fresh clone's first run, `python -m evaluator --retrieval-only` with an empty cache.

Two runs back to back, each with its own empty --cache-dir (so each embeds the whole 47k registry
from scratch): the code as it was before the embedding backends (`--before`, default commit 2acddc3,
unpacked with `git archive` into a temporary folder and run there with the same virtualenv; its
default on a CPU was torch fp32) and the working tree's default (`--backend auto`).
Reported: wall time of each and their ratio, and the largest difference between their RtP figures
(every RtP row of summary.json: recall, precision, miss per subset, gold set and k). Beside them, the
compute floor of any fp32 path on this machine: the forward passes' multiply-adds over the texts'
real tokens (no padding), from the model's config, at the rate this machine's BLAS reaches on the
model's own matrix shape (numpy float32, with the kernels OpenBLAS picks for this CPU: an
environment's OPENBLAS_CORETYPE may name older ones) — and the share of it the new run's embedding
(tokenising + forward passes, from its meta.json) reaches, the goal being >= 0.85, with the CPU's vector
extensions named. Each run's largest process peak RSS is sampled (the first run's bound: 1.5 GiB).
`--before REV` compares with another commit, e.g. the previous main, to show the memory bound costs no
speed (run both orders). Not part of `python -m bench` (about 2 x 5 minutes on 2 quiet cores).

    python -m bench.embed_first_run [--order now-first|now-only]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from .common import REPO, Goal, Result, Stamp, TreeRSS, checkout, data_dir, finish, machine

NAME = "embed_first_run"
MEASURES = ("evaluator", "bench/embed_first_run.py")  # the code it measures (`python -m bench --check`)
TITLE = "First run of a fresh clone (--retrieval-only, empty cache): now (auto) vs before (torch fp32)"
BEFORE = "2acddc3"  # the last commit before the embedding backends
RUNS = ("before (--before)", "now: auto (default)")


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
    """One first run of `code` on an empty cache (no folder of shared exports: the model is exported), its
    process tree's RSS sampled."""
    cache, out = work / "cache", work / "out"
    cmd = [sys.executable, "-m", "evaluator", "--retrieval-only", "--no-progress", "--data", data_dir(),
           "--cache-dir", str(cache), "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EVALUATOR_SHARED_EXPORTS")}
    t0 = time.perf_counter()
    with open(work / "log", "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=code, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        with TreeRSS(proc.pid, every_s=0.1) as rss:
            rc = proc.wait()
    wall = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {rc}:\n{(work / 'log').read_text()[-2000:]}")
    summary = orjson.loads((out / "summary.json").read_bytes())
    meta = orjson.loads((out / "meta.json").read_bytes()) if (out / "meta.json").exists() else {}
    return wall, {"summary": summary, "meta": meta, "top5": _top5(out), "largest_rss": rss.largest}


def _texts() -> list[str]:
    """What a first run embeds: the registry's texts and the test queries."""
    from evaluator.data import load_registry
    from evaluator.data.queries import find_query_files, read_query_file

    texts = load_registry(data_dir()).texts()
    for f in find_query_files(Path(data_dir())):
        texts += [q.text for q in read_query_file(f)]
    return list(dict.fromkeys(texts))


def forward_flops(lens) -> float:
    """FLOPs of MiniLM-L6's fp32 forward passes over texts of `lens` real tokens (no padding), from the
    model's config: per token and layer, 2 x the multiply-adds of the Q, K, V and output projections
    (4 h^2) and the feed-forward up and down (2 h x intermediate), plus attention over the text's own
    length (scores and weighted values: 2 h x length); embeddings, layer norms, softmax, GELU and pooling
    are left out (a few % of the time, none of the multiply-adds). MiniLM-L6: 21.2 MFLOP a token + 9.2
    kFLOP x the text's length."""
    import json

    import numpy as np

    from evaluator.retrieval.bundled import MINILM
    from evaluator.retrieval.embed import resolve_model

    cfg = json.loads((Path(resolve_model(MINILM)[0]) / "config.json").read_text())
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    lens = np.asarray(lens, dtype=np.float64)
    per_token = 2 * layers * (4 * h * h + 2 * h * inter)  # Q, K, V, output; feed-forward up and down
    attention = 2 * layers * 2 * h * lens  # scores and weighted values, per token, over its own text
    return float(np.sum(lens * per_token + lens * attention))


def compute_floor() -> dict[str, float]:
    """Seconds of fp32 arithmetic a first run cannot avoid here: `forward_flops` of every text's real
    tokens at the best sgemm rate numpy reaches here on the model's shapes (4,096 tokens through the
    feed-forward and the projections) or on a square 2,048 product (BLAS's best case)."""
    import json

    import numpy as np
    from tokenizers import Tokenizer

    from evaluator.core import threads
    from evaluator.retrieval.bundled import MINILM
    from evaluator.retrieval.embed import resolve_model

    threads.configure_env()
    root = Path(resolve_model(MINILM)[0])
    h, inter = (json.loads((root / "config.json").read_text())[k] for k in ("hidden_size", "intermediate_size"))
    tk = Tokenizer.from_file(str(root / "tokenizer.json"))
    tk.no_padding()
    tk.enable_truncation(256)  # the model's max_seq_length (sentence_bert_config.json)
    lens = np.array([len(e.ids) for e in tk.encode_batch(_texts())], dtype=np.float64)
    flops = forward_flops(lens)
    shapes = ((4096, h, inter), (4096, inter, h), (4096, h, h), (2048, 2048, 2048))
    # OpenBLAS may be told to use older kernels than the CPU has (OPENBLAS_CORETYPE=Haswell on an AVX-512
    # host): the floor is the host's, so it is measured with the kernels OpenBLAS picks for this CPU, in a
    # child process (the variable is read when the library loads), and beside it with the environment's.
    auto = _sgemm_rates(shapes, {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"})
    told = _sgemm_rates(shapes, dict(os.environ)) if os.environ.get("OPENBLAS_CORETYPE") else auto
    rates = {k: max(auto["rates"][k], told["rates"][k]) for k in auto["rates"]}
    rate = max(rates.values()) * 1e9
    return {"texts": float(len(lens)), "tokens": float(lens.sum()), "tflop": flops / 1e12,
            "sgemm_gflops": rate / 1e9, "sgemm_gflops_by_shape": rates, "floor_s": flops / rate,
            "sgemm_kernels": auto["kernels"], "sgemm_kernels_env": told["kernels"],
            "sgemm_gflops_env_by_shape": told["rates"]}


_SGEMM = """
import json, sys, time
import numpy as np
from threadpoolctl import threadpool_info
rates, cpu_rates = {}, {}
for m, kk, n in json.loads(sys.argv[1]):
    a = np.random.default_rng(0).standard_normal((m, kk)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((kk, n)).astype(np.float32)
    a @ b  # warm the BLAS threads
    best = best_cpu = 0.0
    for _ in range(3):  # the best of three: other people's load only ever slows a round
        c0, t0, reps = time.process_time(), time.perf_counter(), max(3, int(1e10 // (2 * m * kk * n)))
        for _ in range(reps):
            a @ b
        best = max(best, reps * 2 * m * kk * n / (time.perf_counter() - t0) / 1e9)
        best_cpu = max(best_cpu, reps * 2 * m * kk * n / (time.process_time() - c0) / 1e9)
    rates[f"{m}x{kk}@{kk}x{n}"] = best
    cpu_rates[f"{m}x{kk}@{kk}x{n}"] = best_cpu
kernels = next((i.get("architecture") for i in threadpool_info() if i.get("user_api") == "blas"), None)
print(json.dumps({"rates": rates, "cpu_rates": cpu_rates, "kernels": kernels}))
"""


def _sgemm_rates(shapes, env: dict[str, str], threads: int | None = None) -> dict[str, Any]:
    """numpy float32 matmul GFLOP/s on each shape (`rates`; `cpu_rates`: per CPU second of the process),
    in a child process with `env` on `threads` threads (default: every CPU this process may use), and
    OpenBLAS's kernel set."""
    import json

    from evaluator.core.threads import available_cpus

    n = str(threads or available_cpus())
    env = env | {"OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n}
    out = subprocess.run([sys.executable, "-c", _SGEMM, json.dumps(shapes)], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


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
        metas[name]["embed_runtime"] = got["meta"].get("runtime", {}).get("embed_runtime")
        metas[name]["largest_rss_mib"] = got["largest_rss"] / 2**20
    ref, new = RUNS
    if ref not in walls:  # --order now-only: nothing to compare with; the floor and the peak alone
        walls[ref], sums[ref], tops[ref] = float("nan"), {}, {}
        metas[ref] = {"largest_rss_mib": float("nan")}
    common = sorted(set(sums[ref]) & set(sums[new]))
    diff = max((abs(sums[ref][k] - sums[new][k]) for k in common), default=float("nan"))
    shared = sorted(set(tops[ref]) & set(tops[new]))
    same_list = sum(tops[ref][q] == tops[new][q] for q in shared) / max(len(shared), 1)
    same_set = sum(set(tops[ref][q]) == set(tops[new][q]) for q in shared) / max(len(shared), 1)
    speed = walls[ref] / walls[new]
    floor = compute_floor()
    # The embedding's share of the floor: the fp32 arithmetic's seconds over the seconds the run spent
    # tokenising and in forward passes (its meta.json; the export, a one-off, is reported beside it).
    e = metas[new].get("embed") or {}
    embed_s = float(e.get("tokenize_s", 0.0)) + float(e.get("infer_s", 0.0))
    of_floor = floor["floor_s"] / embed_s if embed_s else float("nan")
    of_floor_infer = floor["floor_s"] / float(e["infer_s"]) if e.get("infer_s") else float("nan")
    rows = [[n, round(walls[n], 1), round(walls[ref] / walls[n], 2), round(metas[n]["largest_rss_mib"])]
            for n in RUNS if walls[n] == walls[n]]  # a run not made (now-only) is nan
    ffn = floor["sgemm_gflops_by_shape"]["4096x384@384x1536"]
    floor["floor_model_shape_s"] = floor["tflop"] * 1e3 / ffn
    rows += [["fp32 arithmetic alone at sgemm's rate on the model's feed-forward shape (no run)",
              round(floor["floor_model_shape_s"], 1), round(walls[ref] / floor["floor_model_shape_s"], 2), "-"],
             ["fp32 arithmetic alone at sgemm's best rate here (no run)", round(floor["floor_s"], 1),
              round(walls[ref] / floor["floor_s"], 2), "-"],
             ["now: tokenising + forward passes (meta.json)", round(embed_s, 1), "-", "-"]]
    vector = machine().get("cpu_vector", [])
    return Result(
        extra_tables=[_breakdown(walls, metas)],
        name=NAME, title=TITLE, columns=["run", "wall s", "speed vs before", "largest process peak RSS MiB"],
        rows=rows,
        goals=[Goal("now's embedding (tokenise + forward passes) as a fraction of the fp32 floor", of_floor, ">= 0.85",
                    of_floor >= 0.85),
               Goal("first run: peak RSS of the largest process, GiB", metas[new]["largest_rss_mib"] / 1024, "<= 1.5",
                    metas[new]["largest_rss_mib"] <= 1.5 * 1024),
               *([Goal("max |RtP figure difference| vs before", diff, "<= 0.005", diff <= 0.005),
                  Goal("queries whose RtP top-5 list (order included) equals before's", same_list, ">= 0.98",
                       same_list >= 0.98)] if shared else [])],
        notes=[f"order: {', '.join(order)}; each with its own empty --cache-dir; 'before' = commit {before}; "
               f"{len(common)} RtP figures of summary.json compared; top-5 of {len(shared)} queries compared "
               f"(identical lists {same_list:.4f}, identical sets {same_set:.4f})",
               f"floor: {floor['texts']:,.0f} texts, {floor['tokens']:,.0f} real tokens, {floor['tflop']:.1f} TFLOP of "
               f"fp32 forward passes, at numpy sgemm's rate on the model's feed-forward shape ({ffn:.0f} GFLOP/s) and on "
               f"its best shape ({floor['sgemm_gflops']:.0f} GFLOP/s), OpenBLAS kernels {floor['sgemm_kernels']} "
               f"(the environment's: {floor['sgemm_kernels_env']}), measured after the runs, best of 3 rounds each",
               f"fraction of the floor: {of_floor:.3f} of the embedding (tokenise + forward passes, {embed_s:.1f} s), "
               f"{of_floor_infer:.3f} of the forward passes alone; the runtime: {metas[new].get('embed_runtime')}; "
               f"CPU vector extensions: {', '.join(vector) or 'unknown'}",
               f"before's wall / now's: {speed:.2f}",
               "the machine is shared: see loadavg at start and end; the fraction of the floor needs a quiet machine"],
        data={"wall_s": walls, "max_rtp_diff": diff, "figures_compared": len(common), "meta": metas,
              "top5_identical_lists": same_list, "top5_identical_sets": same_set, "top5_queries": len(shared),
              "before": before, "floor": floor, "fraction_of_floor": of_floor,
              "fraction_of_floor_forward_passes": of_floor_infer, "cpu_vector": vector},
    )


_PARTS = (("model_load_s", "import torch + load the model"), ("export_s", "export + compile the runtime"),
          ("tokenize_s", "tokenize"), ("infer_s", "forward passes"))


def _breakdown(walls: dict[str, float], metas: dict[str, Any]) -> dict[str, Any]:
    """Where each run's seconds went, from its meta.json (the embedder's own timings where it has
    them; 'before' records only the embed stage's total)."""
    rows = []
    for name in (n for n in RUNS if walls[n] == walls[n]):  # a run not made (now-only) is nan
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

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", choices=["before-first", "now-first", "now-only"], default="before-first",
                    help="now-only: the working tree's first run alone (its fraction of the floor and peak RSS)")
    ap.add_argument("--before", default=BEFORE, help="the commit to compare with (default %(default)s)")
    a = ap.parse_args()
    order = {"before-first": list(RUNS), "now-first": list(reversed(RUNS)), "now-only": [RUNS[1]]}[a.order]
    t0 = time.perf_counter()
    st = Stamp()
    r = run(order, a.before)
    finish(r, t0, st, "bench.embed_first_run")


if __name__ == "__main__":
    main()
