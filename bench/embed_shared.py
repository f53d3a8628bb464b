"""Benchmark: the embedder alone vs beside a busy CPU-bound process (thread hygiene).

Each measurement is a fresh process that embeds the same seeded registry texts for a fixed time
and reports texts/s; the busy neighbour is one spinning Python process per CPU this process may
use, minus one (one on 2 cores): what a second evaluator's tokenizer, a build or
a benchmark looks like. Quiet and busy measurements alternate (quiet, busy, busy, quiet) so a
drift of the shared machine's own load cancels out of the ratio.

Two configurations per runtime path:
- `hygiene`: what the evaluator does (threads.py): pools sized to the allowed CPUs, passive waits;
- `spinning`: the same pools with OMP_WAIT_POLICY=ACTIVE, ONNX Runtime spinning on, OpenVINO's
  threads pinned to cores: what the libraries' defaults do, for contrast.

    python -m bench.embed_shared [--paths torch:fp32 openvino:bf16] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from typing import Any

from .common import PYTHON, REPO, Goal, Result

NAME = "embed_shared"
MEASURES = ("evaluator/retrieval", "evaluator/core/threads.py", "bench/embed_shared.py")  # the code it measures (`python -m bench --check`)
TITLE = "Embedding beside a busy CPU-bound process: texts/s vs the same embedder alone"
WORKER = r"""
import json, sys, time
import numpy as np
from evaluator.retrieval.embed import Embedder
from evaluator.settings.load import load_settings
from evaluator.study.prepare import load_inputs
backend, precision, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
spin = sys.argv[4] == "spinning"
texts = load_inputs(load_settings().data).registry.texts()
idx = np.random.default_rng(1).choice(len(texts), 4096, replace=False)
sample = [texts[i] for i in idx]
e = Embedder(backend=backend, precision=precision, device="cpu", cache_dir=None, progress=False)
if spin and backend == "onnx":
    import evaluator.retrieval.backends as eb
    real = eb.onnxruntime_runner
    def spinning(path, threads):
        import onnxruntime as ort
        so = ort.SessionOptions(); so.intra_op_num_threads = threads
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        return (lambda f: sess.run(None, {n: f[n] for n in names})[0]), "onnxruntime (spinning)"
    eb.onnxruntime_runner = spinning
if spin and backend == "openvino":  # OpenVINO's defaults: threads pinned to cores
    import evaluator.retrieval.backends as eb
    def pinned(path, precision, threads):
        import openvino as ov
        c = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"})
        r = c.create_infer_request(); names = [p.get_any_name() for p in c.inputs]
        return (lambda f: r.infer({n: f[n] for n in names})[0].copy()), "openvino (defaults, pinned)"
    eb.openvino_runner = pinned
e._encode_raw(sample[:128])  # warm
done, t0, i = 0, time.perf_counter(), 0
while time.perf_counter() - t0 < seconds:
    batch = sample[(i * 256) % 4096:(i * 256) % 4096 + 256]
    e._encode_raw(batch)
    done += len(batch); i += 1
print(json.dumps({"texts_per_s": done / (time.perf_counter() - t0), "runtime": e.description}))
"""


def _worker(backend: str, precision: str, seconds: float, config: str) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if config == "spinning":
        env["OMP_WAIT_POLICY"] = "ACTIVE"
    return [PYTHON, "-c", WORKER, backend, precision, str(seconds), config], env


def _measure(backend: str, precision: str, seconds: float, config: str) -> dict[str, Any]:
    cmd, env = _worker(backend, precision, seconds, config)
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=seconds * 10 + 300)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _busy(neighbour: str, backend: str, precision: str, seconds: float, config: str) -> list[subprocess.Popen]:
    if neighbour == "embedder":  # a second evaluator embedding at the same time, same configuration
        cmd, env = _worker(backend, precision, seconds * 4 + 60, config)
        return [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    # One process keeps one core busy (Python's GIL): n - 1 processes for n - 1 busy cores.
    return [subprocess.Popen([PYTHON, "-c", "while True: pass"]) for _ in range(max(1, _cpus() - 1))]


def _cpus() -> int:
    from evaluator.core import threads

    return threads.available_cpus()


def run(paths=(("torch", "fp32"), ("openvino", "fp32")), seconds: float = 15.0, configs=("hygiene", "spinning"),
        neighbour: str = "spin") -> Result:
    n = _cpus()
    busy_procs = max(1, n - 1)
    rows: list[list[Any]] = []
    data: dict[str, Any] = {"threads": n, "busy_processes": busy_procs, "seconds_each": seconds}
    goals: list[Goal] = []
    for b, p in paths:
        for config in configs:
            quiet, busy = [], []
            for phase in ("quiet", "busy", "busy", "quiet"):
                procs = _busy(neighbour, b, p, seconds, config) if phase == "busy" else []
                try:
                    time.sleep((8.0 if neighbour == "embedder" else 0.5) if procs else 0)  # neighbour warmed up
                    r = _measure(b, p, seconds, config)
                finally:
                    for pr in procs:
                        pr.kill()
                        pr.wait()
                (busy if phase == "busy" else quiet).append(r["texts_per_s"])
            q, bz = sum(quiet) / 2, sum(busy) / 2
            name = f"{b} {p}, {config}"
            rows.append([name, round(q, 1), round(bz, 1), round(bz / q, 3)])
            data[name] = {"quiet": quiet, "busy": busy, "runtime": r["runtime"]}
            if config == "hygiene":
                goals.append(Goal(f"{b} {p}: busy / quiet rate", bz / q, ">= 0.75", bz / q >= 0.75))
    what = (f"{busy_procs} process(es) spinning one core each" if neighbour == "spin" else
            "a second embedder of the same path and configuration, embedding throughout")
    return Result(
        name=NAME if neighbour == "spin" else f"{NAME}-{neighbour}",
        title=TITLE if neighbour == "spin" else f"{TITLE} (the neighbour: a second embedder)", columns=["embedder", "quiet texts/s", "beside busy texts/s", "busy / quiet"],
        rows=rows, goals=goals, data=data,
        notes=[f"{n} CPUs available to the process; the neighbour: {what}",
               "a fair scheduler gives the embedder's threads about n/(n+1) of the cores beside one spinning "
               "process (2/3 on 2 cores), so ~0.67 is the ceiling there, not 1; beside a second embedder with "
               "as many threads, 1/2",
               "quiet and busy alternate (quiet, busy, busy, quiet); other users' load is in machine.loadavg"],
    )


def main() -> None:
    from .common import Stamp, finish

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", nargs="*", default=["torch:fp32", "openvino:fp32"], help="backend:precision")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--neighbour", choices=["spin", "embedder"], default="spin")
    a = ap.parse_args()
    t0 = time.perf_counter()
    st = Stamp()
    r = run(tuple(tuple(x.split(":")) for x in a.paths), a.seconds, neighbour=a.neighbour)
    finish(r, t0, st, "bench.embed_shared")


if __name__ == "__main__":
    main()
