"""google-genai drives the simulator's Gemini file and batch routes: resumable upload (several chunks, the
`X-Goog-Upload-Status` handshake), files.get/download, batches create from a file, get, list, cancel, and
every job state. Bodies are parsed by the SDK's own types (`File`, `BatchJob`, `GenerateContentResponse`,
`JobError`), which forbid unknown fields."""

from __future__ import annotations

import io
import time

import orjson
import pytest
from helpers import sdk as F
from helpers.sdk import chat_body

genai = pytest.importorskip("google.genai")
from google.genai import _api_client, errors, types  # noqa: E402

from evaluator.batch.providers import GEMINI_JSONL_MIME, GeminiBatch, chat_to_gemini, status_result  # noqa: E402
from simulator.harness import admin_call, configure_batch  # noqa: E402

FINAL = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"}


def client(sim) -> genai.Client:
    return genai.Client(api_key="x", http_options=types.HttpOptions(base_url=sim.root))


def jsonl(n: int, start: int = 0) -> bytes:
    return b"".join(orjson.dumps({"key": f"k{i}", "request": chat_to_gemini(chat_body(i))}) + b"\n"
                    for i in range(start, start + n))


def upload(c: genai.Client, data: bytes, name: str = "requests") -> types.File:
    # The documented call: UploadFileConfig(display_name=..., mime_type="jsonl").
    return c.files.upload(file=io.BytesIO(data), config=types.UploadFileConfig(display_name=name, mime_type=GEMINI_JSONL_MIME))


def until_done(c: genai.Client, name: str, timeout_s: float = 300.0) -> tuple[types.BatchJob, list[str]]:
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        job = c.batches.get(name=name)
        if not seen or seen[-1] != job.state.name:
            seen.append(job.state.name)
        if job.state.name in FINAL:
            return job, seen
        assert time.monotonic() < deadline, f"job stuck in {job.state.name}"
        time.sleep(0.02)


def result_lines(c: genai.Client, job: types.BatchJob) -> list[dict]:
    assert job.dest is not None and job.dest.file_name
    return [orjson.loads(x) for x in c.files.download(file=job.dest.file_name).splitlines() if x.strip()]


def test_resumable_upload_in_several_chunks_ends_final(sim, monkeypatch):
    monkeypatch.setattr(_api_client, "CHUNK_SIZE", 256)  # 8 MB in the SDK: force "upload" chunks before "finalize"
    data = jsonl(8)
    assert len(data) > 3 * 256
    c = client(sim)
    f = upload(c, data)
    assert f.state.name == "ACTIVE" and f.size_bytes == len(data) and f.mime_type == GEMINI_JSONL_MIME
    assert f.display_name == "requests" and f.name.startswith("files/")
    assert c.files.get(name=f.name).size_bytes == len(data)


ORDER = ["JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"]


def test_batch_from_a_file_runs_pending_running_succeeded_and_its_results_download(sim):
    # Each state pinned where a test can meet it (a turnaround far away: pending; a stuck job: running), the walk
    # itself only forward to succeeded: which phases a poll catches of a batch moved by its age is timing.
    configure_batch(sim.base_url, turnaround_s=1e6)
    c = client(sim)
    f = upload(c, jsonl(5))
    job = c.batches.create(model="sim-1", src=f.name, config={"display_name": "conformance-1"})
    assert job.state.name == "JOB_STATE_PENDING" and job.display_name == "conformance-1"
    configure_batch(sim.base_url, stuck_next=1)
    stuck = c.batches.create(model="sim-1", src=upload(c, jsonl(1, start=9), "stuck").name)
    assert c.batches.get(name=stuck.name).state.name == "JOB_STATE_RUNNING"
    c.batches.cancel(name=stuck.name)
    configure_batch(sim.base_url, turnaround_s=0.6)
    done, seen = until_done(c, job.name)
    assert seen == [s for s in ORDER if s in seen] and seen[-1] == "JOB_STATE_SUCCEEDED"  # forward only
    assert done.end_time is not None and done.create_time is not None
    out = result_lines(c, done)
    assert sorted(x["key"] for x in out) == [f"k{i}" for i in range(5)]
    for x in out:
        r = types.GenerateContentResponse.model_validate(x["response"])
        assert r.text and r.usage_metadata.total_token_count > 0


def test_failed_lines_are_google_rpc_status_and_the_project_marks_them_permanent(sim):
    configure_batch(sim.base_url, p_fail=0.5, seed=4, fail_kind="invalid")
    c = client(sim)
    done, _ = until_done(c, c.batches.create(model="sim-1", src=upload(c, jsonl(8)).name).name)
    assert done.state.name == "JOB_STATE_SUCCEEDED"
    errs = [x for x in result_lines(c, done) if "error" in x]
    assert errs
    for x in errs:
        status = types.JobError.model_validate(x["error"])  # google.rpc.Status: a gRPC code, no HTTP status
        assert status.code == 3
        r = status_result(x["key"], x["error"])
        assert r.status_code == 400 and "INVALID_ARGUMENT" in r.reason() and "HTTP 3" not in r.reason()


def test_expired_job_has_no_results(sim):
    configure_batch(sim.base_url, expire_next=1)
    c = client(sim)
    done, _ = until_done(c, c.batches.create(model="sim-1", src=upload(c, jsonl(4)).name).name)
    assert done.state.name == "JOB_STATE_EXPIRED" and done.dest is None


def test_oversized_job_fails(sim):
    configure_batch(sim.base_url, max_requests=2)
    c = client(sim)
    done, _ = until_done(c, c.batches.create(model="sim-1", src=upload(c, jsonl(3)).name).name)
    assert done.state.name == "JOB_STATE_FAILED"


def test_cancel_ends_cancelled(sim):
    configure_batch(sim.base_url, stuck_next=1)
    c = client(sim)
    job = c.batches.create(model="sim-1", src=upload(c, jsonl(3)).name)
    assert c.batches.get(name=job.name).state.name in ("JOB_STATE_PENDING", "JOB_STATE_RUNNING")
    c.batches.cancel(name=job.name)
    done, _ = until_done(c, job.name)
    assert done.state.name == "JOB_STATE_CANCELLED"
    never_ran = [status_result(x["key"], x["error"]) for x in result_lines(c, done)]
    assert never_ran and all(r.status_code is None for r in never_ran)  # submitted again, not failed


def test_create_with_a_full_queue_is_a_429(sim):
    configure_batch(sim.base_url, turnaround_s=5.0, max_enqueued_tokens=100)  # ~28 tokens a request
    c = client(sim)
    first = c.batches.create(model="sim-1", src=upload(c, jsonl(2)).name)
    with pytest.raises(errors.ClientError) as e:
        c.batches.create(model="sim-1", src=upload(c, jsonl(2, 2)).name)
    assert e.value.code == 429 and e.value.status == "RESOURCE_EXHAUSTED"
    c.batches.cancel(name=first.name)


def test_list_pages_through_every_job(sim):
    c = client(sim)
    f = upload(c, jsonl(1))
    made = [c.batches.create(model="sim-1", src=f.name, config={"display_name": f"list-{i}"}).name for i in range(5)]
    listed = [j.name for j in c.batches.list(config={"page_size": 2})]  # the pager follows nextPageToken
    assert set(made) <= set(listed)


def test_the_project_client_and_the_sdk_see_the_same_job(sim):
    """What `GeminiBatch` submits (its own upload, its JSONL), the SDK finds by display name and reads."""
    name = F.submit_with_project_client(GeminiBatch, sim, 3, "tok-gemini")
    c = client(sim)
    assert name in [j.name for j in c.batches.list() if j.display_name == "tok-gemini"]
    done, _ = until_done(c, name)
    assert done.state.name == "JOB_STATE_SUCCEEDED"
    assert sorted(x["key"] for x in result_lines(c, done)) == ["key-0", "key-1", "key-2"]
    op = admin_call(sim.root, "GET", f"/v1beta/{name}")  # the raw operation names the uploaded input file
    assert c.files.get(name=op["metadata"]["inputConfig"]["fileName"]).mime_type == GEMINI_JSONL_MIME
