"""Two processes on one API key: one shared RPM (one cache folder) against each pacing to the full limit.

One simulator enforces `RPM` with 429s (token bucket, one second of burst), as a provider enforces a
key's limit. The same `N` distinct requests are sent three ways with `python -m evaluator requests run`
(each profile set to `--rpm RPM`, the provider's published limit):
- *one process*: all N, alone — the reference: paced to the limit, no 429 expected;
- *two processes, two caches*: N/2 each at the same time, each with its own cache folder, so each paces
  to the full RPM by itself (what every run did before the shared pacer): together twice the limit;
- *two processes, one cache*: the same, sharing one cache folder, hence one pacing row on disk.
Reported per scenario: 429s the simulator answered, requests it received, and the sending time (from the
first process's engine start to the last one's end; Python start-up left out) over the one-process reference. Goals:
the shared pair takes no more 429s than one process (+1% of requests: the simulator, starved of CPU on a
loaded machine, answers in bunches), and sends in at most 1.10x its time.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson

from simulator.harness import start_simulator

from .common import PYTHON, REPO, Goal, Result, temp_dir

NAME = "shared_rate"
MEASURES = ("evaluator/llm", "evaluator/batch", "evaluator/app/request_commands.py", "simulator", "bench/shared_rate.py")  # the code it measures (`python -m bench --check`)
TITLE = "9. Two processes on one key: shared RPM pacing vs each pacing alone"
RPM = 1200  # 20 requests/s: the limit, on the simulator and in every profile
N = 400  # requests in all (about 20 s at the limit)
SIM = {"latency_s": 0.05}


def _requests(n: int) -> list[bytes]:
    return [orjson.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                          "body": {"messages": [{"role": "user", "content": f"Request {i}: name one planet."}],
                                   "max_tokens": 16}}) + b"\n" for i in range(n)]


def _cmd(req: Path, out: Path, cache: Path, base_url: str) -> list[str]:
    return [PYTHON, "-m", "evaluator", "requests", "run", str(req), "--model", "sim", "--base-url", base_url,
            "--rpm", str(RPM), "--cache-dir", str(cache), "--out", str(out), "--no-progress"]


def _scenario(sim: Any, tmp: Path, name: str, files: list[Path], caches: list[Path]) -> dict[str, Any]:
    sim.reset_stats()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.time()
    procs = [subprocess.Popen(_cmd(f, tmp / f"{name[:3]}-{i}.out.jsonl", c, sim.base_url), cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i, (f, c) in enumerate(zip(files, caches, strict=True))]
    ends: dict[int, float] = {}
    while len(ends) < len(procs):  # each process's own end time, whichever finishes first
        for i, p in enumerate(procs):
            if i not in ends and p.poll() is not None:
                ends[i] = time.time()
        time.sleep(0.01)
    starts = []
    for i, p in enumerate(procs):
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"{name}: requests run failed ({p.returncode}): {err.decode()[-500:]}")
        # "Wrote N results to F in X s": the engine's time, from before the first request (start-up left out)
        starts.append(ends[i] - float(re.search(rb" in ([0-9.]+) s", out).group(1)))  # type: ignore[union-attr]
    st = sim.stats()
    return {"scenario": name, "processes": len(files), "http_429": st["by_status"].get("429", 0),
            "requests": st["requests"], "ok": st["ok"], "sending_s": round(max(ends.values()) - min(starts), 2),
            "wall_s": round(max(ends.values()) - t0, 2)}


def run() -> Result:
    with temp_dir("shared-rate") as tmp, start_simulator(rpm=RPM, **SIM) as sim:
        lines = _requests(N)
        whole, half_a, half_b = tmp / "all.jsonl", tmp / "a.jsonl", tmp / "b.jsonl"
        whole.write_bytes(b"".join(lines))
        half_a.write_bytes(b"".join(lines[: N // 2]))
        half_b.write_bytes(b"".join(lines[N // 2:]))
        rows = [
            _scenario(sim, tmp, "one process", [whole], [tmp / "c-one"]),
            _scenario(sim, tmp, "two processes, two caches (each paces alone)", [half_a, half_b],
                      [tmp / "c-a", tmp / "c-b"]),
            _scenario(sim, tmp, "two processes, one cache (shared pacing)", [half_a, half_b],
                      [tmp / "c-shared", tmp / "c-shared"]),
        ]
    base = rows[0]["sending_s"]
    for r in rows:
        r["sending_vs_one"] = round(r["sending_s"] / base, 3)
    one, alone, shared = rows
    floor = (N - RPM / 60) * 60 / RPM  # the simulator's bucket admits at most B + r*t requests by time t
    noise = max(one["http_429"], 1) + N // 100  # 429s one process takes on this machine (server-side bunching)
    return Result(
        name=NAME, title=TITLE,
        columns=["scenario", "processes", "429s", "requests", "sending s", "sending / one process", "wall s (start-up incl.)"],
        rows=[[r["scenario"], r["processes"], r["http_429"], r["requests"], r["sending_s"], r["sending_vs_one"],
               r["wall_s"]] for r in rows],
        goals=[Goal("429s of the shared pair, beyond one process's + 1% of requests", shared["http_429"] - noise,
                    "<= 0", shared["http_429"] <= noise),
               Goal("sending time of the shared pair / one process", shared["sending_vs_one"], "<= 1.10",
                    shared["sending_vs_one"] <= 1.10)],
        notes=[f"{N} distinct requests, simulator limit {RPM} RPM (1 s burst), latency {SIM['latency_s']} s; every "
               f"profile --rpm {RPM}; rate floor {floor:.1f} s. *sending*: from the first process's engine start to "
               "the last one's end (Python start-up and imports left out; *wall* includes them).",
               f"Each pacing alone: {alone['http_429']} 429s for {N} replies ({alone['requests']} requests): every 429 "
               "is a refused request and a Retry-After wait; one shared schedule keeps the pair at the key's limit. "
               "The few 429s of the one-process reference come from the simulator answering in bunches on a loaded "
               "machine, not from the pacing."],
        data={"rpm": RPM, "n": N, "sim": SIM, "rows": rows, "floor_s": round(floor, 2)},
    )
