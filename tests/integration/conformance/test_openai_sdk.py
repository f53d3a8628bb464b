"""openai-python drives the simulator's chat, files and batch routes; every body is validated against the
SDK's own types (`ChatCompletion`, `FileObject`, `Batch`, `BatchError`) with pydantic validation, which the
SDK's lenient parsing alone would not do."""

from __future__ import annotations

import io
import time

import orjson
import pytest
from helpers import sdk as F
from helpers.sdk import chat_body

openai = pytest.importorskip("openai")
from openai.types import Batch, BatchError, FileObject  # noqa: E402
from openai.types.chat import ChatCompletion  # noqa: E402

from evaluator.batch.providers import OpenAIBatch  # noqa: E402
from evaluator.batch.request_format import parse_results  # noqa: E402
from simulator.harness import batch_stats, configure_batch  # noqa: E402


def client(sim):
    return openai.OpenAI(base_url=sim.base_url, api_key="x", max_retries=0)


def upload(c, n: int, start: int = 0) -> FileObject:
    lines = [{"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": chat_body(i)}
             for i in range(start, start + n)]
    data = b"".join(orjson.dumps(x) + b"\n" for x in lines)
    raw = c.files.with_raw_response.create(file=("batch.jsonl", io.BytesIO(data)), purpose="batch")
    f = FileObject.model_validate(orjson.loads(raw.content))
    assert f.bytes == len(data) and f.purpose == "batch"
    return f


def retrieve(c, batch_id: str) -> Batch:
    raw = c.batches.with_raw_response.retrieve(batch_id)
    return Batch.model_validate(orjson.loads(raw.content))  # strict: a status outside the SDK's Literal fails


def until_done(c, batch_id: str, timeout_s: float = 300.0) -> tuple[Batch, list[str]]:
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        b = retrieve(c, batch_id)
        if not seen or seen[-1] != b.status:
            seen.append(b.status)
        if b.status in ("completed", "failed", "expired", "cancelled"):
            return b, seen
        assert time.monotonic() < deadline, f"batch stuck in {b.status}"
        time.sleep(0.02)


def lines(c, file_id: str) -> list[dict]:
    return [orjson.loads(x) for x in c.files.content(file_id).content.splitlines() if x.strip()]


def test_chat_completion_parses_as_the_sdk_type(sim):
    raw = client(sim).chat.completions.with_raw_response.create(model="sim-1", messages=chat_body(1)["messages"], seed=1)
    cc = ChatCompletion.model_validate(orjson.loads(raw.content))
    assert cc.choices[0].message.content and cc.usage is not None and cc.usage.total_tokens > 0


ORDER = ["validating", "in_progress", "finalizing", "completed"]


def test_batch_walks_every_running_status_and_its_output_file_holds_chat_completions(sim):
    # The simulator moves a batch by its age: which phases a poll catches is a matter of timing. So each phase is
    # pinned where a test can meet it (a turnaround far away: validating; a stuck batch: in_progress) and checked
    # against the SDK's strict model; the walk itself must only go forward and end completed.
    configure_batch(sim.base_url, turnaround_s=1e6)
    c = client(sim)
    f = upload(c, 6)
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                         metadata={"study": "conformance"})
    assert b.status == "validating" and b.metadata == {"study": "conformance"}
    assert retrieve(c, b.id).status == "validating"
    configure_batch(sim.base_url, stuck_next=1)
    stuck = c.batches.create(input_file_id=upload(c, 1).id, endpoint="/v1/chat/completions", completion_window="24h")
    assert retrieve(c, stuck.id).status == "in_progress"
    c.batches.cancel(stuck.id)
    configure_batch(sim.base_url, turnaround_s=1.5)
    done, seen = until_done(c, b.id)
    assert seen == [s for s in ORDER if s in seen] and seen[-1] == "completed"  # forward only
    assert done.request_counts.total == 6 and done.request_counts.completed == 6 and done.error_file_id is None
    assert done.completed_at is not None and done.in_progress_at is not None
    out = lines(c, done.output_file_id)
    assert sorted(x["custom_id"] for x in out) == [f"req-{i}" for i in range(6)]
    for x in out:
        assert x["error"] is None and x["response"]["status_code"] == 200
        ChatCompletion.model_validate(x["response"]["body"])
    got = FileObject.model_validate(orjson.loads(c.files.with_raw_response.retrieve(done.output_file_id).content))
    assert got.purpose == "batch_output"


def test_failed_requests_go_to_the_error_file_and_the_project_reads_them(sim):
    configure_batch(sim.base_url, p_fail=0.5, seed=2, fail_kind="invalid")
    c = client(sim)
    done, _ = until_done(c, c.batches.create(input_file_id=upload(c, 8).id, endpoint="/v1/chat/completions",
                                             completion_window="24h").id)
    assert done.status == "completed" and done.error_file_id and done.output_file_id
    errs = lines(c, done.error_file_id)
    assert len(errs) == done.request_counts.failed > 0
    for x in errs:
        assert x["response"]["status_code"] == 400 and x["response"]["body"]["error"]["type"] == "invalid_request_error"
    results = parse_results(c.files.content(done.error_file_id).content, "error file")
    assert {r.kind() for r in results} == {"HTTP 400"} and not any(r.ok for r in results)


def test_oversized_and_queue_full_batches_fail_with_sdk_batch_errors(sim):
    c = client(sim)
    configure_batch(sim.base_url, max_requests=2)
    big, _ = until_done(c, c.batches.create(input_file_id=upload(c, 3).id, endpoint="/v1/chat/completions",
                                            completion_window="24h").id)
    assert big.status == "failed" and big.failed_at is not None
    assert BatchError.model_validate(big.errors.data[0].model_dump()).code == "batch_too_large"

    configure_batch(sim.base_url, reset=True, turnaround_s=5.0, max_enqueued_tokens=100)  # ~56 tokens a batch
    first = c.batches.create(input_file_id=upload(c, 2).id, endpoint="/v1/chat/completions", completion_window="24h")
    second = retrieve(c, c.batches.create(input_file_id=upload(c, 2, 2).id, endpoint="/v1/chat/completions",
                                          completion_window="24h").id)
    assert retrieve(c, first.id).status in ("validating", "in_progress")
    assert second.status == "failed" and second.errors.data[0].code == "token_limit_exceeded"
    assert "try again once some in_progress batches have been completed" in second.errors.data[0].message
    c.batches.cancel(first.id)


def test_expired_batch_keeps_what_ran_and_names_the_rest_batch_expired(sim):
    configure_batch(sim.base_url, expire_next=1, expire_done_share=0.5)
    c = client(sim)
    done, _ = until_done(c, c.batches.create(input_file_id=upload(c, 6).id, endpoint="/v1/chat/completions",
                                             completion_window="24h").id)
    assert done.status == "expired" and done.expired_at is not None
    assert len(lines(c, done.output_file_id)) == 3
    errs = lines(c, done.error_file_id)
    assert len(errs) == 3 and {(x["response"], x["error"]["code"]) for x in errs} == {(None, "batch_expired")}


def test_cancel_goes_through_cancelling_to_cancelled(sim):
    configure_batch(sim.base_url, stuck_next=1)
    c = client(sim)
    b = c.batches.create(input_file_id=upload(c, 4).id, endpoint="/v1/chat/completions", completion_window="24h")
    raw = c.batches.with_raw_response.cancel(b.id)
    cancelling = Batch.model_validate(orjson.loads(raw.content))
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    done, _ = until_done(c, b.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert {x["error"]["code"] for x in lines(c, done.error_file_id)} == {"batch_cancelled"}
    assert batch_stats(sim.base_url)["cancelled"] == 1


def test_list_pages_through_every_batch_newest_first(sim):
    c = client(sim)
    f = upload(c, 1)
    made = [c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id
            for _ in range(5)]
    listed = [b.id for b in c.batches.list(limit=2)]  # the SDK follows has_more/after itself
    assert listed[:5] == made[::-1]
    page = c.batches.list(limit=2)
    assert page.has_more is True and len(page.data) == 2


def test_the_project_client_and_the_sdk_see_the_same_batch(sim):
    """What `OpenAIBatch` submits, the SDK finds by its token and reads; what the SDK sees, the project parses."""
    batch_id = F.submit_with_project_client(OpenAIBatch, sim, 3, "tok-1")
    c = client(sim)
    done, _ = until_done(c, batch_id)
    assert done.metadata == {"evaluator_token": "tok-1"} and done.request_counts.completed == 3
    results = parse_results(c.files.content(done.output_file_id).content, "output")
    assert sorted(r.custom_id for r in results) == ["key-0", "key-1", "key-2"] and all(r.ok for r in results)
