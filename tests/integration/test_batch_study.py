"""The study through Batch APIs and request files, end to end on the tiny data folder (simulator on loopback)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from helpers.cli import run_cli, start_cli
from helpers.data import make_data_dir
from helpers.procs import simulator, wait_until
from helpers.records import same_rows

from evaluator.batch.providers import OpenAIBatch
from evaluator.batch.request_format import read_requests, write_lines
from evaluator.batch.store import JobStore
from evaluator.llm import load_profile, revised
from simulator.harness import batch_stats, configure_batch, reset_batch_stats


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("batchws")
    data = make_data_dir(root / "data")
    with simulator() as sim:
        yield root, data, sim


@pytest.fixture
def sim(ws):
    root, data, s = ws
    configure_batch(s.base_url, reset=True, turnaround_s=0.1)
    reset_batch_stats(s.base_url)
    s.reset_stats()
    return s


def study_args(ws, model: str, cache: Path, out: Path) -> list[str]:
    root, data, sim = ws
    return ["--data", str(data), "--cache-dir", str(cache), "--out", str(out), "--model", model, "--runs", "2",
            "--base-url", sim.base_url, "--no-progress", "--no-extras"]


def rows(out: Path) -> list[dict]:
    return json.loads((out / "summary.json").read_text())["rows"]


@pytest.fixture(scope="module")
def online(ws):
    """The online study per model: the reference every batch path must reproduce."""
    root = ws[0]
    done = {}
    for model in ("sim", "sim-b"):
        r = run_cli(*study_args(ws, model, root / f"c-online-{model}", root / f"online-{model}"), cwd=root)
        assert r.returncode == 0, r.stderr
        done[model] = rows(root / f"online-{model}")
    return done


@pytest.mark.parametrize("model, faults", [("sim", True), ("sim-b", False)])
def test_batch_study_equals_online_study(ws, sim, online, tmp_path, model, faults):
    if faults:  # failed and expired requests are re-submitted; none is answered (paid) twice
        configure_batch(sim.base_url, p_fail=0.25, expire_next=1, seed=5)
    r = run_cli(*study_args(ws, model, tmp_path / "c", tmp_path / "out"), "--batch", cwd=ws[0])
    assert r.returncode == 0, r.stderr
    assert same_rows(rows(tmp_path / "out"), online[model])
    server = batch_stats(sim.base_url)
    assert server["repeated_ok"] == 0 and server["requests_ok"] == 30  # 5 queries x 2 runs x 3 calls
    assert sim.stats()["requests"] == 0  # nothing went to the online endpoint
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    b = meta["batch"][model]
    assert b["stored"] == 30 and b["batches"] >= 2  # round 1, then the PtR planners
    if faults:  # every submission is accounted for: answered once, or failed / expired and submitted again
        assert server["requests_failed"] > 0 and server["requests_expired"] > 0
        assert b["submitted"] == 30 + server["requests_failed"] + server["requests_expired"]
    cost = meta["cost"][model]
    assert cost["batch"]["usd"] == pytest.approx(cost["all_online_usd"] / 2)
    assert "batch" in (tmp_path / "out" / "report.md").read_text().lower()


def start_batch_study(ws, sim, args) -> subprocess.Popen:
    """A `--batch` study in a child process (its own process group), returned once its first batch exists at the
    simulator."""
    child = start_cli(*args, "--batch", cwd=ws[0], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_until(lambda: batch_stats(sim.base_url)["batches_created"] >= 1, child, what="the study's first batch")
    return child


def _submitted(cache: Path) -> bool:
    """Whether the study's job store holds a submitted batch's id (what a rerun resumes)."""
    store = JobStore(cache)
    try:
        return any(j.batch_id for j in store.open_jobs("sim"))
    finally:
        store.close()


def test_sigkill_while_polling_then_rerun_submits_no_batch_twice(ws, sim, online, tmp_path):
    configure_batch(sim.base_url, turnaround_s=60.0)
    args = study_args(ws, "sim", tmp_path / "c", tmp_path / "out")
    child = start_batch_study(ws, sim, args)
    wait_until(lambda: _submitted(tmp_path / "c"), child, what="the batch's id in the job store")  # now polling
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    configure_batch(sim.base_url, turnaround_s=0.1)
    r = run_cli(*args, "--batch", cwd=ws[0])
    assert r.returncode == 0, r.stderr
    assert "resuming 1 batch" in r.stderr
    server = batch_stats(sim.base_url)
    assert server["batches_created"] == 2  # round 1 once (resumed, not re-submitted), round 2 once
    assert server["requests_ok"] == 30 and server["repeated_ok"] == 0
    assert same_rows(rows(tmp_path / "out"), online["sim"])


def test_batch_cancel_cancels_open_batches(ws, sim, tmp_path):
    configure_batch(sim.base_url, stuck_next=1)
    args = study_args(ws, "sim", tmp_path / "c", tmp_path / "out")
    child = start_batch_study(ws, sim, args)
    wait_until(lambda: _submitted(tmp_path / "c"), child, what="the batch's id in the job store")
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    r = run_cli(*args, "--batch-cancel", cwd=ws[0])
    assert r.returncode == 0, r.stderr
    assert "cancelled 1 open batch" in r.stderr + r.stdout
    assert batch_stats(sim.base_url)["cancelled"] == 1


def test_export_simulated_batch_import_then_study_from_cache(ws, sim, online, tmp_path):
    root, data, _ = ws
    cache = tmp_path / "c"
    flags = ["--data", str(data), "--cache-dir", str(cache), "--model", "sim", "--runs", "2", "--no-progress"]
    profile = revised(load_profile("sim", base_url=sim.base_url), batch="openai")

    async def through_batch_api(src: Path, dst: Path) -> None:
        api = OpenAIBatch(profile, None)
        try:
            batch_id = await api.submit(read_requests(src), "export-test")
            while not (await api.state(batch_id)).done:
                await asyncio.sleep(0.05)
            write_lines(dst, await api.results(batch_id))
        finally:
            await api.close()

    for rnd in (1, 2):
        ex = run_cli("requests", "export", str(tmp_path / f"r{rnd}.jsonl"), *flags, cwd=root)
        assert ex.returncode == 0, ex.stderr
        asyncio.run(through_batch_api(tmp_path / f"r{rnd}.jsonl", tmp_path / f"o{rnd}.jsonl"))
        im = run_cli("requests", "import", str(tmp_path / f"o{rnd}.jsonl"), "--cache-dir", str(cache), cwd=root)
        assert im.returncode == 0, im.stderr
    assert len(read_requests(tmp_path / "r1.jsonl")) == 20 and len(read_requests(tmp_path / "r2.jsonl")) == 10
    sim.reset_stats()
    r = run_cli(*study_args(ws, "sim", cache, tmp_path / "out"), cwd=root)
    assert r.returncode == 0, r.stderr
    assert sim.stats()["requests"] == 0  # the study ran from the imported replies alone
    assert same_rows(rows(tmp_path / "out"), online["sim"])


def test_batch_needs_a_profile_that_declares_one(ws, tmp_path):
    root, data, sim = ws
    prof = tmp_path / "nobatch.toml"
    prof.write_text(f'model = "sim-1"\n[connection]\nbase_url = "{sim.base_url}"\n[server]\nsimulated = true\n',
                    encoding="utf-8")
    r = run_cli("--data", str(data), "--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path / "o"),
                "--model", str(prof), "--batch", "--no-progress", cwd=root)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "batch" in r.stderr and "nobatch" in r.stderr and len(r.stderr.strip().splitlines()) == 1


# -- issue 31: batch work never turns into online calls without a word ----------------------------------------
def _error_lines(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if x.startswith("error:")]


@pytest.mark.parametrize("knobs", [
    {"p_fail": 1.0, "fail_kind": "denied"},  # the provider answers every line with 403
    {"refuse_create": 403},  # the batch itself is refused
    {"expire_next": 100, "expire_done_share": 0.0},  # every batch expires before any request ran
    {"p_fail": 1.0, "fail_kind": "server"},  # every line fails, every re-submission too
], ids=["lines-403", "create-403", "expired", "lines-500"])
def test_a_refused_batch_stops_the_run_before_any_online_call(ws, sim, tmp_path, knobs):
    configure_batch(sim.base_url, **knobs)
    r = run_cli(*study_args(ws, "sim", tmp_path / "c", tmp_path / "out"), "--batch", cwd=ws[0])
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert sim.stats()["requests"] == 0  # nothing was bought at the online price
    errors = _error_lines(r.stderr)
    assert len(errors) == 1, r.stderr
    if "refuse_create" not in knobs:  # a refused create is itself the one line; the others name the way out
        assert "--batch-fallback online" in errors[0] and "Nothing was sent online" in errors[0]
    if knobs.get("fail_kind") == "denied":  # told at once, before the stop
        assert "the provider refused all" in r.stderr.split(errors[0])[0] and "HTTP 403" in r.stderr


def test_batch_fallback_online_sends_the_rest_online_and_says_so(ws, sim, online, tmp_path):
    configure_batch(sim.base_url, p_fail=1.0, fail_kind="denied")
    args = study_args(ws, "sim", tmp_path / "c", tmp_path / "out")
    r = run_cli(*args, "--batch", "--batch-fallback", "online", cwd=ws[0])
    assert r.returncode == 0, r.stderr
    assert "go online at the online price" in r.stderr
    assert sim.stats()["requests"] > 0
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["batch"]["sim"]["online"] > 0 and meta["batch"]["sim"]["stored"] == 0
    assert same_rows(rows(tmp_path / "out"), online["sim"])


def test_batch_replies_without_usage_get_estimated_tokens(ws, sim, tmp_path):
    sim.configure(usage=False)  # the batch routes answer with the online endpoint's bodies
    r = run_cli(*study_args(ws, "sim", tmp_path / "c", tmp_path / "out"), "--batch", cwd=ws[0])
    assert r.returncode == 0, r.stderr
    b = json.loads((tmp_path / "out" / "meta.json").read_text())["batch"]["sim"]
    assert b["usage_estimated"] == b["stored"] == 30
    assert b["prompt_tokens"] > 0 and b["completion_tokens"] > 0
    assert "carried no token usage" in r.stderr
