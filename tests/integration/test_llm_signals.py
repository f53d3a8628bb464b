"""SIGTERM and SIGHUP end a run as Ctrl-C does (issue 18): one line, exit code 130, and the calls on the
wire at that moment get a short grace period to arrive and be cached, so the rerun does not buy them
again (the simulator counts bodies answered twice).

The signal is sent at a state, not a time: with requests on the wire and enough still unsent that the run cannot
have ended, checked while the CLI is stopped (SIGSTOP), so that it cannot end between the check and the signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from helpers.cli import run_cli, start_cli
from helpers.data import make_data_dir
from helpers.procs import communicate, wait_until

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd)


def _stop_mid_flight(p: subprocess.Popen[str], sim, sig: int, at_least: int, calls: int,
                     concurrency: int) -> tuple[int, str]:
    """Send `sig` once `at_least` requests are on the wire and at least `concurrency` of the run's `calls` are still
    unsent (so more than one round of replies is left: the run cannot end before the signal reaches it); (requests
    in flight then, stderr)."""
    def ready() -> int | None:
        st = sim.stats()
        if st["in_flight"] < at_least or st["requests"] > calls - concurrency:
            return None
        os.kill(p.pid, signal.SIGSTOP)  # frozen: the state checked again is the state the signal meets
        st = sim.stats()
        if st["in_flight"] >= at_least and st["requests"] <= calls - concurrency:
            return st["in_flight"]
        os.kill(p.pid, signal.SIGCONT)
        return None

    in_flight = wait_until(ready, p, what=f"{at_least} requests on the wire")
    p.send_signal(sig)
    os.kill(p.pid, signal.SIGCONT)
    _, err = communicate(p, 300)
    assert p.returncode == 130, err
    return in_flight, err


def _one_line(err: str, name: str) -> None:
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith(("note:", "Loading weights"))]
    assert lines == [f"interrupted by {name}: finished LLM calls are cached; rerun the same command to resume."], err
    assert "Traceback" not in err


def test_sigterm_mid_study_stores_the_calls_in_flight(sim, tmp_path):
    # Replies take 1 s, well inside the grace period: what is on the wire at the kill arrives and is cached.
    sim.configure(latency_s=1.0)
    data = make_data_dir(tmp_path / "data")
    prof = tmp_path / "slow.toml"
    prof.write_text(f'model = "sim-1"\n[connection]\nbase_url = "{sim.base_url}"\n[server]\nsimulated = true\n'
                    '[pacing]\nconcurrency = 8\n')
    args = ["--data", str(data), "--cache-dir", str(tmp_path / "cache"), "--model", str(prof), "--runs", "2",
            "--out", str(tmp_path / "out"), "--no-progress"]
    in_flight, err = _stop_mid_flight(start_cli(*args, cwd=tmp_path), sim, signal.SIGTERM, at_least=4, calls=30,
                                      concurrency=8)
    _one_line(err, "SIGTERM")
    at_stop = sim.stats()
    assert at_stop["ok"] >= in_flight  # the calls on the wire were answered, not abandoned
    sim.configure(latency_s=0.0)
    r = _run(args, tmp_path)
    assert r.returncode == 0, r.stderr
    st = sim.stats()
    print(f"in flight at SIGTERM: {in_flight}; answered twice after the rerun: {st['repeated_ok']}")
    # Without the grace period, every call in flight at the kill is bought again by the rerun.
    assert st["repeated_ok"] < in_flight and st["repeated_ok"] == 0
    assert st["ok"] == st["distinct_ok"]


def test_sighup_ends_requests_run_with_one_line_and_keeps_the_calls_in_flight(sim, tmp_path):
    sim.configure(latency_s=1.0)
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"messages": [{"role": "user", "content": f"Question number {i}: what is {i} + {i}?"}],
                       "max_tokens": 64}} for i in range(40)]
    req = tmp_path / "req.jsonl"
    req.write_text("".join(json.dumps(x) + "\n" for x in lines))
    args = ["requests", "run", str(req), "--out", str(tmp_path / "out.jsonl"), "--model", "sim",
            "--base-url", sim.base_url, "--cache-dir", str(tmp_path / "cache"), "--concurrency", "8", "--no-progress"]
    in_flight, err = _stop_mid_flight(start_cli(*args, cwd=tmp_path), sim, signal.SIGHUP, at_least=4, calls=40,
                                      concurrency=8)
    _one_line(err, "SIGHUP")
    sim.configure(latency_s=0.0)
    r = _run(args, tmp_path)
    assert r.returncode == 0, r.stderr
    st = sim.stats()
    assert st["repeated_ok"] < in_flight and st["distinct_ok"] == 40


# -- issue 31: as a scheduler sends them, in the background too, with varied latencies ----------------------------
def _start_as(args: list[str], cwd: Path, *, background: bool) -> subprocess.Popen[str]:
    """The CLI as a script's `cmd &` or `nohup` starts it (SIGINT ignored), or in the foreground."""
    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited through exec, as a shell does for `&`

    return start_cli(*args, cwd=cwd, preexec_fn=ignore_sigint if background else None)


@pytest.mark.parametrize("sig, background", [(signal.SIGTERM, True), (signal.SIGHUP, True), (signal.SIGINT, False)],
                         ids=["sigterm-background", "sighup-background", "sigint-foreground"])
def test_a_stop_signal_keeps_every_call_on_the_wire(sim, tmp_path, sig, background):
    # Replies take 0.2-4 s (lognormal, seeded), as a real server's do: inside the default grace (8 s).
    sim.configure(latency="lognormal", latency_s=0.8, latency_sigma=0.5, seed=3)
    data = make_data_dir(tmp_path / "data")
    prof = tmp_path / "slow.toml"
    prof.write_text(f'model = "sim-1"\n[connection]\nbase_url = "{sim.base_url}"\n[server]\nsimulated = true\n'
                    '[pacing]\nconcurrency = 6\n')
    args = ["--data", str(data), "--cache-dir", str(tmp_path / "cache"), "--model", str(prof), "--runs", "2",
            "--out", str(tmp_path / "out"), "--no-progress", "--no-extras"]
    p = _start_as(args, tmp_path, background=background)
    in_flight, err = _stop_mid_flight(p, sim, sig, at_least=4, calls=30, concurrency=6)
    if sig == signal.SIGINT:
        assert "interrupted: finished LLM calls are cached" in err and "Traceback" not in err
    else:
        _one_line(err, signal.Signals(sig).name)
    at_stop = sim.stats()
    assert at_stop["in_flight"] == 0 and at_stop["abandoned"] == 0
    assert at_stop["ok"] == at_stop["requests"]  # every request sent was answered and kept, none dropped
    sim.configure(latency_s=0.0, latency="fixed")
    r = _run(args, tmp_path)
    assert r.returncode == 0, r.stderr
    st = sim.stats()
    print(f"in flight at {signal.Signals(sig).name}: {in_flight}; answered twice after the rerun: {st['repeated_ok']}")
    assert st["repeated_ok"] == 0 and st["ok"] == st["distinct_ok"]  # the rerun sent only what was missing
