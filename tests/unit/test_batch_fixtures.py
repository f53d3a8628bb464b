"""The batch runner's decisions on recorded provider bodies (tests/fixtures/providers/batch/, each naming
its source): OpenAI batch objects and result lines, Gemini operations, google.rpc.Status result lines and
a create 429, and `vllm run-batch` output with string and object errors, imported through `requests import`."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import orjson
import pytest
from helpers import FIXTURES

from evaluator.batch.batch_submit import BatchRunner, Poll
from evaluator.batch.providers import (
    DEFAULT_LIMITS,
    GEMINI_JSONL_MIME,
    BatchAPIError,
    BatchState,
    GeminiBatch,
    OpenAIBatch,
    gemini_lines,
    gemini_result,
    gemini_state,
    openai_state,
)
from evaluator.batch.request_files import import_files
from evaluator.batch.request_format import BatchFailure, Request, Result, failure_kinds, read_results, split
from evaluator.batch.store import JobStore
from evaluator.cli import main as cli
from evaluator.llm import load_profile
from evaluator.llm.cache import ResponseCache

BATCH = FIXTURES / "providers" / "batch"


def fixture(name: str) -> dict:
    data = orjson.loads((BATCH / name).read_bytes())
    assert data["source"], f"{name} must name its source"
    return data


def runner(p=None) -> BatchRunner:
    """A runner whose engine stores every reply and whose cache holds none: only its decisions matter."""
    engine = SimpleNamespace(store_reply=lambda key, body, request=None: SimpleNamespace(error=None))
    cache = SimpleNamespace(get=lambda key: None)
    return BatchRunner(p or load_profile("sim"), engine, None, None, cache)  # type: ignore[arg-type]


# -- OpenAI ---------------------------------------------------------------------------------------------
def test_openai_batch_objects_are_the_sdk_type_and_the_queue_limit_is_not_a_size_error():
    f = fixture("openai_batch_objects.json")
    openai = pytest.importorskip("openai")
    for body in (f["completed"], f["token_limit_exceeded"]):
        openai.types.Batch.model_validate(body)
    done = openai_state(f["completed"])
    assert (done.status, done.total, done.completed, done.failed) == ("completed", 100, 95, 5)
    full = openai_state(f["token_limit_exceeded"])
    # "Enqueued token limit reached": the account's queue, not this batch's size. The old rule (any "limit")
    # split it in two and re-submitted at once, down to one-request batches that all failed.
    assert full.status == "failed" and full.queue_full and not full.too_large
    too_big = BatchState("failed", errors=[BatchFailure("batch_too_large", "The batch input is too large.")])
    assert too_big.too_large and not too_big.queue_full


def test_openai_result_lines_kinds_and_runner_decisions(tmp_path):
    f = fixture("openai_result_lines.json")
    path = tmp_path / "out.jsonl"
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in f["lines"]))
    results = read_results(path)
    assert {r.custom_id: r.kind() for r in results} == f["kinds"]
    r = runner()
    for res in results:
        r._take(res)
    assert r.stats.stored == 1 and r.stats.not_run == 2 and r.stats.failed == 0 and not r.permanent


class QueueFullOnce:
    """A Batch API whose first create answers the recorded Gemini 429 (a full queue), then accepts."""

    def __init__(self, body: dict) -> None:
        self.body, self.creates, self.batches = body, 0, {}

    def line_size(self, request: Request) -> int:
        return len(request.line())

    async def submit(self, requests: list[Request], token: str) -> str:
        self.creates += 1
        if self.creates == 1:
            raise BatchAPIError(f"sim: POST /v1beta/models/m:batchGenerateContent answered 429: {self.body}", 429)
        self.batches[token] = requests
        return token

    async def find(self, token: str, size: int = 0, since: float = 0.0) -> str | None:
        return None

    async def state(self, batch_id: str) -> BatchState:
        n = len(self.batches[batch_id])
        return BatchState("completed", n, n, 0)

    async def results(self, batch_id: str) -> list[Result]:
        return [Result(r.custom_id, 200, {"choices": []}) for r in self.batches[batch_id]]

    async def cancel(self, batch_id: str) -> None: ...
    async def close(self) -> None: ...


def test_gemini_create_429_defers_the_chunk_instead_of_failing_the_run(tmp_path):
    f = fixture("gemini_batch.json")
    p = load_profile("sim")
    api = QueueFullOnce(f["create_429"])
    store = JobStore(tmp_path)
    stored: list[str] = []
    engine = SimpleNamespace(store_reply=lambda key, body, request=None: stored.append(key) or SimpleNamespace(error=None))
    cache = SimpleNamespace(get=lambda key: {} if key in stored else None)
    try:
        r = BatchRunner(p, engine, api, store, cache, poll=Poll(0.01, 0.02))  # type: ignore[arg-type]
        stats = asyncio.run(r.run([Request(f"k{i}", {"messages": []}) for i in range(3)]))
        assert store.open_jobs(p.name) == []  # the refused create left no job to resume
    finally:
        store.close()
    assert api.creates == 2 and stats.queue_waits == 1 and stats.split == 0 and sorted(stored) == ["k0", "k1", "k2"]


# -- Gemini ---------------------------------------------------------------------------------------------
def test_gemini_operation_and_states():
    f = fixture("gemini_batch.json")
    st = gemini_state(f["operation_succeeded"])
    assert (st.status, st.total, st.completed, st.failed) == ("completed", 3, 2, 1)
    assert gemini_lines(f["operation_succeeded"]) == ("files/batch-123456789", [])
    for state, ours in f["states"].items():
        op = {"metadata": {"state": state}}
        assert gemini_state(op).status == ours, state


def test_gemini_status_lines_are_mapped_by_grpc_code_never_as_http():
    f = fixture("gemini_batch.json")
    r = runner()
    results = [gemini_result(x, "gemini-2.5-flash") for x in f["result_lines"]]
    for res in results:
        assert res is not None
        assert "HTTP 3" not in res.reason() and "HTTP 13" not in res.reason()
        r._take(res)
    decided = {}
    for res in results:
        if res.ok:
            decided[res.custom_id] = "stored"
        elif res.status_code is None:
            decided[res.custom_id] = "not_run"
        else:
            decided[res.custom_id] = "permanent" if res.custom_id in r.permanent else "retry"
    assert decided == f["decisions"]
    assert "INVALID_ARGUMENT" in r.permanent["request-2"]
    assert results[0].body["choices"][0]["message"]["content"] == '{"tools": []}'


# -- vLLM run-batch -------------------------------------------------------------------------------------
def test_vllm_output_with_string_and_object_errors_imports_every_good_reply(tmp_path):
    f = fixture("vllm_run_batch_output.json")
    path = tmp_path / "vllm-results.jsonl"
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in f["lines"]))
    results = read_results(path)  # before the fix: AttributeError 'str' object has no attribute 'get'
    assert {r.custom_id: r.kind() for r in results} == f["kinds"]
    assert failure_kinds(results) == {"HTTP 400": 2, "HTTP 500": 1}
    reasons = {r.custom_id: r.reason() for r in results if not r.ok}
    assert reasons["bad-string"].startswith("HTTP 400: This model's maximum context length")
    assert reasons["bad-object"].startswith("HTTP 400: [{'type': 'missing'")
    assert reasons["bad-flat"] == "HTTP 500: Internal server error"

    counts = import_files([path], tmp_path / "cache", model="sim")
    assert counts.stored == 3 and counts.errors == 3 and counts.error_kinds == {"HTTP 400": 2, "HTTP 500": 1}
    cache = ResponseCache(tmp_path / "cache")
    try:
        assert all(cache.get(k) is not None for k in ("ok-1", "ok-2", "ok-3"))
        assert all(cache.get(k) is None for k in ("bad-string", "bad-object", "bad-flat"))
    finally:
        cache.close()


def test_requests_import_command_on_a_vllm_file_prints_one_summary_line(tmp_path, capsys):
    f = fixture("vllm_run_batch_output.json")
    path = tmp_path / "r1.out.jsonl"
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in f["lines"]))
    rc = cli.main(["requests", "import", str(path), "--model", "sim", "--cache-dir", str(tmp_path / "cache")])
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" not in err, err
    summary = [line for line in out.splitlines() if line.startswith("Imported")]
    assert len(summary) == 1
    assert "Imported 3 replies" in summary[0] and "3 errors (HTTP 400: 2, HTTP 500: 1)" in summary[0]


# -- upload caps and MIME type --------------------------------------------------------------------------
def test_default_caps_are_the_documented_byte_counts_and_split_uses_the_uploaded_line():
    assert DEFAULT_LIMITS["openai"] == (50_000, 200_000_000)  # 200 MB, not 200 MiB
    assert DEFAULT_LIMITS["gemini"] == (None, 2_000_000_000)  # 2 GB
    assert GEMINI_JSONL_MIME == "jsonl"  # the docs' UploadFileConfig(mime_type="jsonl")
    g, o = GeminiBatch, OpenAIBatch  # line sizes need no client
    reqs = [Request(f"k{i}", {"model": "m", "messages": [{"role": "user", "content": "x" * 200}], "seed": i})
            for i in range(10)]
    assert g.line_size(reqs[0]) != o.line_size(reqs[0])
    cap = 3 * g.line_size(reqs[0])
    chunks = split(reqs, None, cap, g.line_size)
    assert [len(c) for c in chunks] == [3, 3, 3, 1]
    assert all(sum(g.line_size(r) for r in c) <= cap for c in chunks)
