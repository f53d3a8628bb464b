"""`requests run --engine ray` on a local Ray: the study's requests through Ray Data LLM (issue 30).

Starting a Ray costs ~10-15 s on 2 cores, so the Ray checks are one test with one Ray head that every
command joins (`--address`), after one command that starts the embedded local Ray itself (the default):
a study's exported requests go through Ray against the bundled simulator and, imported, give the records
of the online run; a run killed mid-way sends, when started again, only what has no reply; failed rows
come back as errors `requests import` counts per kind; no API key reaches Ray's logs or spill files, the
results or the errors. This process never becomes a Ray driver: every Ray command is a child process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray.data.llm", reason="Ray is an optional extra: pip install 'evaluator[ray]'")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from request_fixtures import cached_count, write_requests  # noqa: E402

from evaluator.batch.ray_engine import LOCAL_RAY  # noqa: E402
from evaluator.cli import main as cli  # noqa: E402
from evaluator.llm import load_profile  # noqa: E402
from simulator.harness import start_simulator  # noqa: E402

pytestmark = pytest.mark.ray
MCP = REPO / "examples" / "mcp"
KEY_ENV = "EVALUATOR_TEST_RAY_CANARY_KEY"
KEY = "sk-canary-ray-9d1e-4b7a-key-for-the-workers"


def _start_head(temp: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """A Ray head in its own process group (`ray start --block`), sized as the evaluator's local Ray."""
    ray_bin = Path(sys.executable).with_name("ray")
    head = subprocess.Popen(
        [str(ray_bin), "start", "--head", "--block", "--port", "0", "--node-ip-address", "127.0.0.1",
         "--num-cpus", str(LOCAL_RAY["num_cpus"]), "--object-store-memory", str(LOCAL_RAY["object_store_memory"]),
         "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", str(temp)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = sorted(temp.glob("session_*/ray_current_cluster")) or sorted(temp.glob("ray_current_cluster"))
        if found and found[0].read_text().strip():
            return head, found[0].read_text().strip()
        assert head.poll() is None, "ray start --head exited"
        time.sleep(0.2)
    raise AssertionError("the Ray head did not start in 120 s")


def _stop_head(head: subprocess.Popen) -> None:
    """The head and everything it started (one process group, ours), then a check that none is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(head.pid, signal.SIGTERM)
    try:
        head.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()
    deadline = time.monotonic() + 30
    while _group_alive(head.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _group_alive(head.pid):
        os.killpg(head.pid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _main(args: list[str], capfd) -> tuple[int, str, str]:
    rc = cli.main(args)
    out, err = capfd.readouterr()
    return rc, out, err


def _records(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "queries.jsonl").read_text().splitlines()]


def _main(args: list[str], capfd) -> tuple[int, str, str]:
    rc = cli.main(args)
    out, err = capfd.readouterr()
    return rc, out, err


def _child(args: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "evaluator", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _ray_run(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    p = _child(args, env)
    out, err = p.communicate(timeout=300)
    return p.returncode, out, err


def _records(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "queries.jsonl").read_text().splitlines()]


def _profile(path: Path, base_url: str) -> Path:
    path.write_text(f'model = "sim-1"\n[connection]\nbase_url = "{base_url}"\napi_key_env = "{KEY_ENV}"\n'
                    '[server]\nsimulated = true\n[pacing]\nconcurrency = 16\n[retries]\nmax_retries = 1\n'
                    'backoff_base_s = 0.01\n', encoding="utf-8")
    return path


def test_requests_through_ray(tmp_path, capfd, monkeypatch, request):
    monkeypatch.delenv("EVALUATOR_DATA", raising=False)
    monkeypatch.setenv(KEY_ENV, KEY)  # every Ray process started below inherits it: the workers read it there
    temps = [Path(f"/tmp/evr-{os.getpid()}-{n}") for n in ("embedded", "head")]  # short: Ray's socket paths
    for t in temps:
        shutil.rmtree(t, ignore_errors=True)
        request.addfinalizer(lambda t=t: shutil.rmtree(t, ignore_errors=True))  # pass or fail
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_TMPDIR": str(temps[0])}
    # The test's head and the commands joining it skip Ray's token check: the token file (~/.ray) is shared
    # by everyone on this machine, the head listens for this test only.
    join = {**env, "RAY_AUTH_MODE": "disabled"}
    logs: list[str] = []
    head = None
    marks = [("start", time.perf_counter())]
    try:
        # -- a study's two rounds of requests through Ray; imported, the study gives the online run's records
        base = ["--tools", str(MCP / "tools"), "--queries", str(MCP / "queries.jsonl"), "--limit", "2",
                "--runs", "1", "--model", "sim", "--no-progress", "--no-extras"]
        online, viaray = tmp_path / "online", tmp_path / "ray"
        rc, _, err = _main([*base, "--cache-dir", str(tmp_path / "c1"), "--out", str(online)], capfd)
        assert rc == 0, err
        shutil.copytree(tmp_path / "c1" / "embeddings", tmp_path / "c2" / "embeddings")  # no second embedding
        cache = ["--cache-dir", str(tmp_path / "c2")]
        for n in (1, 2):  # round 2: the PtR planners, built from the discovery replies of round 1
            req, res = tmp_path / f"r{n}.jsonl", tmp_path / f"r{n}.out.jsonl"
            rc, _, err = _main(["requests", "export", str(req), *base, *cache], capfd)
            assert rc == 0, err
            marks.append((f"online study, export {n}", time.perf_counter()))
            if n == 2:  # round 1 started the embedded local Ray itself; from here on, commands join one head
                head, address = _start_head(temps[1], {k: v for k, v in join.items() if k != "RAY_TMPDIR"})
            where = ["--address", address] if n == 2 else []
            rc, out, err = _ray_run(["requests", "run", str(req), "--model", "sim", "--engine", "ray", *where,
                                     "--out", str(res), *cache, "--no-progress"], join if where else env)
            logs += [out, err]
            marks.append((f"round {n} through Ray", time.perf_counter()))
            todo = len(req.read_text().splitlines())
            assert rc == 0 and todo and f"{todo} ok, 0 errors; {todo} requests sent through Ray" in out, out + err
            rc, out, err = _main(["requests", "import", str(res), *cache], capfd)
            assert rc == 0 and "0 errors" in out, out + err
        rc, _, err = _main([*base, *cache, "--out", str(viaray)], capfd)
        assert rc == 0, err
        meta = json.loads((viaray / "meta.json").read_text())
        assert meta["runtime"]["simulator_stats"]["sim"]["requests"] == 0  # every reply came from Ray's results
        assert _records(viaray) == _records(online)
        marks.append(("study", time.perf_counter()))

        # -- killed mid-way (SIGKILL of the driver) and started again: nothing that has a reply is sent again
        n = 400
        lines = write_requests(tmp_path / "in.jsonl", n)
        with start_simulator(latency_s=0.2, api_key=KEY) as sim:
            prof = _profile(tmp_path / "keyed.toml", sim.base_url)
            args = ["requests", "run", str(tmp_path / "in.jsonl"), "--model", str(prof), "--engine", "ray",
                    "--address", address, "--batch-size", "16", "--cache-dir", str(tmp_path / "c3"),
                    "--out", str(tmp_path / "out.jsonl"), "--no-progress"]
            child = _child(args, join)
            deadline = time.monotonic() + 180
            while cached_count(load_profile(str(prof)), tmp_path / "c3", lines, api_key="") < 48:  # three batches back, then kill
                assert child.poll() is None, child.communicate()
                assert time.monotonic() < deadline
                time.sleep(0.1)
            child.kill()
            child.communicate()
            # Ray ends a dead driver's actors; wait until nothing more reaches the simulator.
            last, quiet_since = -1, time.monotonic()
            while time.monotonic() - quiet_since < 2.0:
                if (ok := sim.stats()["ok"]) != last:
                    last, quiet_since = ok, time.monotonic()
                time.sleep(0.1)
            assert not (tmp_path / "out.jsonl").exists()
            done = cached_count(load_profile(str(prof)), tmp_path / "c3", lines, api_key="")
            assert 0 < done < n, done
            sim.reset_stats()
            rc, out, err = _ray_run(args, join)
            logs += [out, err]
            assert rc == 0, err
            assert sim.stats()["ok"] == n - done  # what had a reply came from the cache, not the server
            assert f"{done} answered from the cache" in out, out
        results = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
        assert [r["custom_id"] for r in results] == [x["custom_id"] for x in lines]
        assert all(r["response"]["status_code"] == 200 for r in results)
        marks.append(("kill+resume", time.perf_counter()))

        # -- rows that fail are errors `requests import` counts per kind (Ray's processor retries no 500)
        small = lines[:24]
        write_requests(tmp_path / "small.jsonl", len(small))
        with start_simulator(api_key=KEY, p_500=0.3, seed=7) as sim:
            prof = _profile(tmp_path / "keyed.toml", sim.base_url)
            out_file = tmp_path / "errors.jsonl"
            rc, out, err = _ray_run(["requests", "run", str(tmp_path / "small.jsonl"), "--model", str(prof), "--engine",
                                     "ray", "--address", address, "--cache-dir", str(tmp_path / "c4"),
                                     "--out", str(out_file), "--no-progress"], join)
            logs += [out, err]
            assert rc == 0, err
            codes = [json.loads(x)["response"]["status_code"] for x in out_file.read_text().splitlines()]
            assert len(codes) == len(small) and set(codes) == {200, 500}, codes
            rc, out, err = _main(["requests", "import", str(out_file), "--model", str(prof),
                                  "--cache-dir", str(tmp_path / "c4")], capfd)
            logs += [out, err]
            assert rc == 0 and f"{codes.count(500)} errors (HTTP 500: {codes.count(500)})" in out, out

        # -- a server that quotes a wrong key back (401): the run stops with one line; the key is nowhere
        with start_simulator(api_key="sk-another-key-the-server-expects-0000") as sim:
            prof = _profile(tmp_path / "keyed.toml", sim.base_url)
            rc, out, err = _ray_run(["requests", "run", str(tmp_path / "small.jsonl"), "--model", str(prof), "--engine",
                                     "ray", "--address", address, "--cache-dir", str(tmp_path / "c5"),
                                     "--out", str(tmp_path / "fail.jsonl"), "--no-progress"], join)
            logs += [out, err]
            assert rc == 1 and "HTTP 401" in err and KEY_ENV in err, err
            assert sim.stats()["by_status"].get("401"), sim.stats()
        marks.append(("errors+401", time.perf_counter()))
        print("phases (s):", {m: round(t - p, 1) for (_, p), (m, t) in zip(marks, marks[1:], strict=False)})
    finally:
        if head is not None:
            _stop_head(head)
    ray_files = [p for t in temps for p in t.rglob("*") if p.is_file()]
    assert any(p.name.startswith("raylet") for p in ray_files)  # Ray's own logs are among what is searched
    leaks = [str(p) for p in [*ray_files, *tmp_path.rglob("*")] if p.is_file() and KEY.encode() in p.read_bytes()]
    leaks += [f"output {i}" for i, text in enumerate(logs) if KEY in text]
    assert leaks == []


def test_ray_mistakes_are_one_line_before_ray_starts(tmp_path, capfd, monkeypatch):
    write_requests(tmp_path / "in.jsonl", 3)
    run = ["requests", "run", str(tmp_path / "in.jsonl"), "--model", "sim", "--out", str(tmp_path / "o.jsonl"),
           "--cache-dir", str(tmp_path / "c"), "--no-progress"]
    cases = [([*run, "--address", "auto"], "--address is an option of --engine ray"),
             ([*run, "--engine", "ray", "--processor", "vllm"], "needs vLLM"),
             ([*run, "--engine", "ray", "--rpm", "30"], "whole requests per second per actor"),
             ([*run, "--engine", "ray", "--actors", "0"], "--actors: expected an integer from 1 to 256")]
    for args, needle in cases:
        rc, out, err = _main(args, capfd)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, (args, err)
    with monkeypatch.context() as m:  # Ray not installed: how to install it, in one line
        m.setitem(sys.modules, "ray.data.llm", None)
        rc, out, err = _main([*run, "--engine", "ray"], capfd)
        assert rc == 2 and "pip install 'evaluator[ray]'" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o.jsonl").exists()
