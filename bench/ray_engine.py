"""Benchmark: `requests run --engine ray` (Ray Data LLM) against the evaluator's own engine, same file.

N distinct chat requests, one simulator with a fixed latency, both engines at the same requests in
flight (the evaluator's `concurrency` = Ray's `batch_size` with one actor), each from an empty cache,
alternated (evaluator, Ray, evaluator, Ray) in one process. The local Ray is started once (its start
timed apart, as the evaluator starts it) and used by both Ray runs. Reported: wall time, time per
request, the ratio Ray / evaluator, Ray's overhead per request ((Ray - evaluator) / N), the floor
(N / in-flight x latency), and the peak PSS of Ray's processes. Beside them, Ray's HTTP processor as
shipped (without `ray_worker.KeyedSession`) on a smaller file, which sends a batch one request at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from evaluator.batch.ray_engine import LOCAL_RAY, RayOptions, run_requests_ray
from evaluator.batch.request_files import run_requests
from evaluator.batch.request_format import Request
from evaluator.llm import load_profile
from simulator.harness import start_simulator

from .common import Result, temp_dir

NAME = "ray_engine"
MEASURES = ("evaluator/batch", "evaluator/llm", "simulator", "bench/ray_engine.py")  # the code it measures (`python -m bench --check`)
TITLE = "10. `requests run --engine ray` (Ray Data LLM, local Ray) vs the evaluator's engine on one request file"
N = 800
IN_FLIGHT = 16
LATENCY_S = 0.05
SHIPPED_N = 64  # Ray's processor as shipped sends one request at a time: a smaller file


def _requests(n: int, tag: str) -> list[Request]:
    return [Request(f"{tag}-{i}", {"model": "sim-1", "temperature": 0,
                                   "messages": [{"role": "user", "content": f"{tag}: weather in city {i}"}]})
            for i in range(n)]


class RayPSS:
    """Peak summed PSS of this process's descendants but the simulator (Ray's head, workers, actors)."""

    def __init__(self, skip: int) -> None:
        self.skip, self.peak, self._stop = skip, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for p in psutil.Process().children(recursive=True):
                if p.pid == self.skip:
                    continue
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    total += p.memory_full_info().pss
            self.peak = max(self.peak, total)
            self._stop.wait(0.5)

    def __enter__(self) -> RayPSS:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def _shipped(ray: Any, url: str, n: int) -> float:
    """Ray's HTTP processor with its own session: the same batch size, one actor."""
    import ray.data.llm as ray_llm

    rows = [{"payload": r.body} for r in _requests(n, "shipped")]
    proc = ray_llm.build_processor(
        ray_llm.HttpRequestProcessorConfig(url=url + "/chat/completions", batch_size=IN_FLIGHT, concurrency=1),
        preprocess=lambda row: {"payload": row["payload"]}, postprocess=lambda row: {"ok": "choices" in row["http_response"]})
    t = time.perf_counter()
    out = proc(ray.data.from_items(rows, override_num_blocks=math.ceil(n / IN_FLIGHT))).take_all()
    assert len(out) == n and all(r["ok"] for r in out)
    return time.perf_counter() - t


def run() -> Result:
    try:
        import ray
    except ImportError:
        return Result(NAME, TITLE, ["note"], [["Ray is not installed: pip install 'evaluator[ray]'"]])
    load = os.getloadavg()
    with start_simulator(latency_s=LATENCY_S) as sim, temp_dir("ray-engine") as root:
        profile = load_profile("sim", base_url=sim.base_url, concurrency=IN_FLIGHT)
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        with RayPSS(sim.proc.pid) as pss:
            t = time.perf_counter()
            ray.init(**LOCAL_RAY, logging_level="ERROR", log_to_driver=False)
            start_s = time.perf_counter() - t
            try:
                walls: dict[str, list[float]] = {"evaluator": [], "ray": []}
                for rep in range(2):
                    for engine in ("evaluator", "ray"):
                        reqs = _requests(N, f"{engine}{rep}")  # distinct texts: nothing is cached or shared
                        t = time.perf_counter()
                        if engine == "evaluator":
                            results, _ = asyncio.run(run_requests(reqs, profile, Path(root) / f"e{rep}"))
                        else:
                            results, _, _ = run_requests_ray(reqs, profile, Path(root) / f"r{rep}",
                                                             RayOptions(batch_size=IN_FLIGHT))
                        walls[engine].append(time.perf_counter() - t)
                        assert len(results) == N and all(r.ok for r in results), engine
                shipped_s = _shipped(ray, sim.base_url, SHIPPED_N)
            finally:
                ray.shutdown()
        server = sim.stats()
    ev, ry = min(walls["evaluator"]), min(walls["ray"])
    floor = N / IN_FLIGHT * LATENCY_S
    rows = [
        ["evaluator engine", N, round(ev, 2), round(1e3 * ev / N, 2), round(floor, 2), "1.00"],
        ["Ray Data LLM (HTTP processor + KeyedSession)", N, round(ry, 2), round(1e3 * ry / N, 2), round(floor, 2),
         f"{ry / ev:.2f}"],
        ["Ray's HTTP processor as shipped", SHIPPED_N, round(shipped_s, 2), round(1e3 * shipped_s / SHIPPED_N, 2),
         round(SHIPPED_N / IN_FLIGHT * LATENCY_S, 2), "n/a (other file)"],
    ]
    return Result(
        name=NAME, title=TITLE,
        columns=["engine", "requests", "wall s (best of 2)", "ms/request", "floor s", "ratio to evaluator"],
        rows=rows,
        notes=[
            f"Ray's overhead: {1e3 * (ry - ev) / N:.2f} ms per request ({ry / ev:.2f}x the evaluator's wall), "
            f"on top of starting the local Ray once: {start_s:.1f} s",
            f"peak PSS of Ray's processes (head, workers, actors): {pss.peak / 2**30:.2f} GiB",
            f"runs: evaluator {', '.join(f'{w:.2f}' for w in walls['evaluator'])} s; Ray {', '.join(f'{w:.2f}' for w in walls['ray'])} s",
            f"load average at the start {load[0]:.1f} (2 cores shared): re-measure on a quiet machine",
            f"{IN_FLIGHT} requests in flight for both engines, simulator latency {LATENCY_S * 1e3:.0f} ms; "
            f"the simulator answered {server['requests']} requests, at most {server['max_in_flight']} at once",
        ],
        data={"walls": walls, "ray_start_s": start_s, "shipped_s": shipped_s, "pss_peak": pss.peak,
              "server": server, "loadavg_start": load},
    )
