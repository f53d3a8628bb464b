"""`requests run --engine ray` on a local Ray: the study's requests through Ray Data LLM (issue 30).

Starting a Ray costs ~10-15 s on 2 cores, so the Ray checks are one test with one Ray head that every
command joins (`--address`), after one command that starts the embedded local Ray itself (the default):
a study's exported requests go through Ray against the bundled simulator and, imported, give the records
of the online run; a run killed mid-way sends, when started again, only what has no reply; failed rows
come back as errors `requests import` counts per kind; no API key reaches Ray's logs or spill files, the
results or the errors. This process never becomes a Ray driver: every Ray command is a child process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import EXAMPLE
from helpers.cli import CLI
from helpers.procs import child_env, communicate, run, simulator, start, stop, wait_until
from helpers.request_files import cached_count, write_requests

pytest.importorskip("ray.data.llm", reason="Ray is an optional extra: pip install 'evaluator[ray]'")

from evaluator.batch.ray_engine import LOCAL_RAY  # noqa: E402
from evaluator.cli import main as cli  # noqa: E402
from evaluator.llm import load_profile  # noqa: E402

pytestmark = pytest.mark.ray
MCP = EXAMPLE
KEY_ENV = "EVALUATOR_TEST_RAY_CANARY_KEY"
KEY = "sk-canary-ray-9d1e-4b7a-key-for-the-workers"


def _start_head(temp: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """A Ray head in its own process group (`ray start --block`), sized as the evaluator's local Ray; (it, its
    address) once it has written its address."""
    ray_bin = Path(sys.executable).with_name("ray")
    head = start(
        [str(ray_bin), "start", "--head", "--block", "--port", "0", "--node-ip-address", "127.0.0.1",
         "--num-cpus", str(LOCAL_RAY["num_cpus"]), "--object-store-memory", str(LOCAL_RAY["object_store_memory"]),
         "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", str(temp)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def address() -> str | None:
        found = sorted(temp.glob("session_*/ray_current_cluster")) or sorted(temp.glob("ray_current_cluster"))
        return (found[0].read_text().strip() or None) if found else None

    return head, wait_until(address, head, what="the Ray head's address")


def _main(args: list[str], capfd) -> tuple[int, str, str]:
    rc = cli.main(args)
    out, err = capfd.readouterr()
    return rc, out, err


def _ray_run(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    done = run([*CLI, *args], env=env, timeout=600)
    return done.returncode, done.stdout, done.stderr


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
    env = child_env({"RAY_TMPDIR": str(temps[0])})
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
        n = 400  # 0.05 s a reply: what is left after three batches still takes seconds when the kill comes
        lines = write_requests(tmp_path / "in.jsonl", n)
        with simulator(latency_s=0.05, api_key=KEY) as sim:
            prof = _profile(tmp_path / "keyed.toml", sim.base_url)
            args = ["requests", "run", str(tmp_path / "in.jsonl"), "--model", str(prof), "--engine", "ray",
                    "--address", address, "--batch-size", "16", "--cache-dir", str(tmp_path / "c3"),
                    "--out", str(tmp_path / "out.jsonl"), "--no-progress"]
            child = start([*CLI, *args], env=join)
            wait_until(lambda: cached_count(load_profile(str(prof)), tmp_path / "c3", lines, api_key="") >= 48, child,
                       what="three batches back")  # then kill the driver alone (SIGKILL: no clean-up)
            child.kill()
            communicate(child, 300)
            # Ray ends a dead driver's actors: nothing more reaches the simulator once nothing is in flight there
            wait_until(lambda: sim.stats()["in_flight"] == 0, what="the dead driver's actors ended")
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
        with simulator(api_key=KEY, p_500=0.3, seed=7) as sim:
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
        with simulator(api_key="sk-another-key-the-server-expects-0000") as sim:
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
            stop(head, grace_s=30)  # the head and everything it started: one process group
    ray_files = [p for t in temps for p in t.rglob("*") if p.is_file()]
    assert any(p.name.startswith("raylet") for p in ray_files)  # Ray's own logs are among what is searched
    leaks = [str(p) for p in [*ray_files, *tmp_path.rglob("*")] if p.is_file() and KEY.encode() in p.read_bytes()]
    leaks += [f"output {i}" for i, text in enumerate(logs) if KEY in text]
    assert leaks == []
