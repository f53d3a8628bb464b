"""The simulator's provider Batch APIs: OpenAI-style files + batches, and Gemini's native batch API.

OpenAI style (`/v1/files`, `/v1/files/{id}/content`, `/v1/batches`, `/v1/batches/{id}`,
`/v1/batches/{id}/cancel`, list with `GET /v1/batches`): an uploaded JSONL of chat requests becomes a
batch whose output and error files follow OpenAI's result format. Gemini style (resumable upload at
`/upload/v1beta/files`, `POST /v1beta/models/{m}:batchGenerateContent`, `GET /v1beta/batches[/{id}]`,
`:cancel`, download at `/download/v1beta/files/{id}:download`): GenerateContentRequest lines keyed by
`key`, results as `{"key", "response" | "error"}` lines.

Replies come from the online endpoint's own `Simulator.reply_body`, so a batch study and an online
study agree. Time is lazy: a batch's state is worked out from its age each
time it is read. Knobs (`BatchConfig`, set at runtime with `POST /admin/batch`): turnaround, a share of
failed requests, batches that expire or stay in progress, per-batch size limits that fail oversized
batches. `GET /batch/stats` counts batch creations and every request answered (and answered twice).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

if TYPE_CHECKING:
    from .server import Simulator


@dataclass
class BatchConfig:
    turnaround_s: float = 0.2  # from create to completed (progress grows linearly in between)
    p_fail: float = 0.0  # share of requests answered with a 500 in the error file
    expire_next: int = 0  # the next N batches created expire at turnaround with only part done
    expire_done_share: float = 0.5  # share of an expiring batch's requests answered before it expires
    stuck_next: int = 0  # the next N batches created stay in_progress until cancelled
    max_requests: int | None = None  # per-batch limits: an oversized batch fails validation
    max_bytes: int | None = None
    seed: int = 0


@dataclass
class _Stats:
    batches_created: int = 0
    files_uploaded: int = 0
    rejected_oversized: int = 0
    cancelled: int = 0
    expired: int = 0
    requests_ok: int = 0
    requests_failed: int = 0
    requests_expired: int = 0
    ok_by_request: dict[str, int] = field(default_factory=dict)  # request body digest -> times answered

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        counts = d.pop("ok_by_request").values()
        d["distinct_ok"] = len(self.ok_by_request)
        d["repeated_ok"] = sum(1 for c in counts if c > 1)  # the same request answered (billed) twice
        return d


@dataclass
class _Batch:
    id: str
    style: str  # "openai" | "gemini"
    lines: list[tuple[str, dict[str, Any]]]  # (custom_id or key, chat request body)
    created: float
    input_file_id: str
    metadata: dict[str, Any]
    model: str = ""
    fate: str = "complete"  # complete | expire | stuck | oversized
    status: str = "validating"
    cancelled_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    counts: tuple[int, int] = (0, 0)  # completed, failed (final)
    errors: list[dict[str, Any]] = field(default_factory=list)


# -- Gemini <-> chat translation (the simulator answers chat messages either way) ----------------------
def gemini_to_chat(request: dict[str, Any]) -> dict[str, Any]:
    """A GenerateContentRequest as the chat body the same call would be online."""
    messages: list[dict[str, Any]] = []
    sys_inst = request.get("system_instruction") or request.get("systemInstruction")
    if sys_inst:
        messages.append({"role": "system", "content": "".join(p.get("text", "") for p in sys_inst.get("parts", []))})
    for c in request.get("contents", []):
        role = "assistant" if c.get("role") == "model" else "user"
        messages.append({"role": role, "content": "".join(p.get("text", "") for p in c.get("parts", []))})
    gen = request.get("generation_config") or request.get("generationConfig") or {}
    body: dict[str, Any] = {"messages": messages, "temperature": gen.get("temperature", 0.0)}
    if "seed" in gen:
        body["seed"] = gen["seed"]
    if "maxOutputTokens" in gen:
        body["max_tokens"] = gen["maxOutputTokens"]
    if gen.get("responseMimeType") == "application/json":
        schema = gen.get("responseJsonSchema")
        body["response_format"] = (
            {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}} if schema is not None else {"type": "json_object"}
        )
    return body


def chat_to_gemini_response(completion: dict[str, Any]) -> dict[str, Any]:
    choice = completion["choices"][0]
    usage = completion["usage"]
    return {
        "candidates": [{
            "content": {"role": "model", "parts": [{"text": choice["message"]["content"]}]},
            "finishReason": "MAX_TOKENS" if choice["finish_reason"] == "length" else "STOP",
            "index": 0,
        }],
        "usageMetadata": {
            "promptTokenCount": usage["prompt_tokens"],
            "candidatesTokenCount": usage["completion_tokens"],
            "totalTokenCount": usage["total_tokens"],
        },
        "modelVersion": completion["model"],
    }


_GEMINI_STATE = {
    "validating": "BATCH_STATE_PENDING", "in_progress": "BATCH_STATE_RUNNING", "finalizing": "BATCH_STATE_RUNNING",
    "completed": "BATCH_STATE_SUCCEEDED", "failed": "BATCH_STATE_FAILED", "expired": "BATCH_STATE_EXPIRED",
    "cancelling": "BATCH_STATE_RUNNING", "cancelled": "BATCH_STATE_CANCELLED",
}


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json", headers=headers)


def _error(status: int, message: str) -> web.Response:
    return _json({"error": {"code": status, "message": message, "type": "invalid_request_error"}}, status)


class BatchSim:
    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.cfg = BatchConfig()
        self.stats = _Stats()
        self.rng = random.Random(0)
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, _Batch] = {}
        self.uploads: dict[str, dict[str, Any]] = {}  # Gemini resumable upload sessions
        self._ids = itertools.count(1)
        self._answered = 0

    # -- helpers ---------------------------------------------------------------------------------------
    def _new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):06d}"

    def _authorized(self, request: web.Request) -> bool:
        key = self.sim.cfg.api_key
        if not key:
            return True
        return request.headers.get("Authorization") == f"Bearer {key}" or request.headers.get("x-goog-api-key") == key

    def _create(self, style: str, file_id: str, lines: list[tuple[str, dict]], metadata: dict, model: str = "") -> _Batch:
        cfg = self.cfg
        b = _Batch(self._new_id("batch_"), style, lines, time.monotonic(), file_id, metadata, model)
        self.stats.batches_created += 1
        size = len(self.files.get(file_id, b""))
        if (cfg.max_requests is not None and len(lines) > cfg.max_requests) or (cfg.max_bytes is not None and size > cfg.max_bytes):
            b.fate, b.status = "oversized", "failed"
            self.stats.rejected_oversized += 1
            what = f"{len(lines)} requests, {size} bytes; limits {cfg.max_requests} requests, {cfg.max_bytes} bytes"
            b.errors = [{"code": "batch_too_large", "message": f"The batch input is too large ({what}).", "line": None}]
        elif cfg.stuck_next > 0:
            cfg.stuck_next -= 1
            b.fate = "stuck"
        elif cfg.expire_next > 0:
            cfg.expire_next -= 1
            b.fate = "expire"
        self.batches[b.id] = b
        return b

    def _advance(self, b: _Batch) -> None:
        """Bring `b` up to date with the clock: finish it when its time has come."""
        if b.status in ("completed", "failed", "expired", "cancelled"):
            return
        age = time.monotonic() - b.created
        if b.cancelled_at is not None:
            self._finish(b, "cancelled", self._progress(b, b.cancelled_at - b.created))
            self.stats.cancelled += 1
            return
        if b.fate == "stuck" or age < self.cfg.turnaround_s:
            b.status = "in_progress"
            return
        if b.fate == "expire":
            self._finish(b, "expired", int(len(b.lines) * self.cfg.expire_done_share))
            self.stats.expired += 1
        else:
            self._finish(b, "completed", len(b.lines))

    def _progress(self, b: _Batch, age: float) -> int:
        if b.fate == "stuck" or self.cfg.turnaround_s <= 0:
            return 0 if b.fate == "stuck" else len(b.lines)
        return min(len(b.lines), int(len(b.lines) * age / self.cfg.turnaround_s))

    def _finish(self, b: _Batch, status: str, n_done: int) -> None:
        out, err = [], []
        failed = 0
        for i, (cid, req) in enumerate(b.lines):
            if i >= n_done:
                self.stats.requests_expired += 1
                code = "batch_expired" if status == "expired" else "batch_cancelled"
                err.append(self._line(b, cid, None, {"code": code, "message": f"request not executed: batch {status}"}))
                continue
            if self.cfg.p_fail > 0 and self.rng.random() < self.cfg.p_fail:
                failed += 1
                self.stats.requests_failed += 1
                err.append(self._line(b, cid, (500, {"error": {"message": "The server had an error.", "type": "server_error"}}), None))
                continue
            self._answered += 1
            body = self.sim.reply_body(req, reply_id=f"chatcmpl-simbatch-{self._answered}")  # exactly the online reply
            digest = hashlib.sha256(orjson.dumps(req, option=orjson.OPT_SORT_KEYS)).hexdigest()
            self.stats.ok_by_request[digest] = self.stats.ok_by_request.get(digest, 0) + 1
            self.stats.requests_ok += 1
            out.append(self._line(b, cid, (200, body), None))
        if b.style == "gemini":
            lines = out + err  # Gemini writes one results file, errors inline
            b.output_file_id = self._store_file(lines) if lines else None
        else:
            b.output_file_id = self._store_file(out) if out else None
            b.error_file_id = self._store_file(err) if err else None
        b.counts = (n_done - failed, failed + len(b.lines) - n_done)
        b.status = status

    def _line(self, b: _Batch, cid: str, response: tuple[int, dict] | None, error: dict | None) -> dict[str, Any]:
        if b.style == "gemini":
            if response is not None and response[0] == 200:
                return {"key": cid, "response": chat_to_gemini_response(response[1])}
            if response is not None:
                return {"key": cid, "error": {"code": response[0], "message": response[1]["error"]["message"], "status": "INTERNAL"}}
            return {"key": cid, "error": {"code": 499, "message": error["message"] if error else "", "status": "CANCELLED"}}
        resp = None if response is None else {"status_code": response[0], "request_id": self._new_id("req_"), "body": response[1]}
        return {"id": self._new_id("batch_req_"), "custom_id": cid, "response": resp, "error": error}

    def _store_file(self, lines: list[dict]) -> str:
        fid = self._new_id("file-")
        self.files[fid] = b"".join(orjson.dumps(x) + b"\n" for x in lines)
        return fid

    # -- OpenAI style ----------------------------------------------------------------------------------
    async def upload(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(401, "Incorrect API key provided.")
        form = await request.post()
        f = form.get("file")
        if form.get("purpose") != "batch" or not isinstance(f, web.FileField):
            return _error(400, "expected multipart fields purpose=batch and file")
        data = f.file.read()
        fid = self._new_id("file-")
        self.files[fid] = data
        self.stats.files_uploaded += 1
        return _json({"id": fid, "object": "file", "bytes": len(data), "created_at": int(time.time()),
                      "filename": f.filename, "purpose": "batch"})

    def _file(self, request: web.Request, denied: str) -> web.Response:
        # Both APIs serve a stored file the same way; only their wording of a bad key differs.
        if not self._authorized(request):
            return _error(401, denied)
        data = self.files.get(request.match_info["file_id"])
        if data is None:
            return _error(404, "No such file")
        return web.Response(body=data, content_type="application/octet-stream")

    async def file_content(self, request: web.Request) -> web.Response:
        return self._file(request, "Incorrect API key provided.")

    async def create(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(401, "Incorrect API key provided.")
        req = orjson.loads(await request.read())
        data = self.files.get(req.get("input_file_id", ""))
        if data is None:
            return _error(404, f"No such file: {req.get('input_file_id')!r}")
        if req.get("endpoint") != "/v1/chat/completions":
            return _error(400, "endpoint must be /v1/chat/completions")
        try:
            lines = [(x["custom_id"], x["body"]) for x in map(orjson.loads, data.splitlines()) if x]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return _error(400, "input file is not batch JSONL (custom_id, method, url, body)")
        if len({c for c, _ in lines}) != len(lines):
            return _error(400, "custom_id values must be unique within a batch")
        b = self._create("openai", req["input_file_id"], lines, req.get("metadata") or {})
        return _json(self._openai_view(b))

    def _openai_view(self, b: _Batch) -> dict[str, Any]:
        self._advance(b)
        done, failed = b.counts
        if b.status == "in_progress":
            done = self._progress(b, time.monotonic() - b.created)
        return {
            "id": b.id, "object": "batch", "endpoint": "/v1/chat/completions",
            "errors": {"object": "list", "data": b.errors} if b.errors else None,
            "input_file_id": b.input_file_id, "completion_window": "24h", "status": b.status,
            "output_file_id": b.output_file_id, "error_file_id": b.error_file_id,
            "created_at": int(time.time() - (time.monotonic() - b.created)),
            "request_counts": {"total": len(b.lines), "completed": done, "failed": failed},
            "metadata": b.metadata,
        }

    def _batch(self, request: web.Request, style: str) -> _Batch | web.Response:
        """The batch a request names, or the error response each API gives for a bad key or an unknown id."""
        if not self._authorized(request):
            return _error(401, "Incorrect API key provided." if style == "openai" else "API key not valid.")
        b = self.batches.get(request.match_info["batch_id"])
        if b is None or b.style != style:
            return _error(404, "No such batch")
        return b

    async def retrieve(self, request: web.Request) -> web.Response:
        b = self._batch(request, "openai")
        return b if isinstance(b, web.Response) else _json(self._openai_view(b))

    async def list(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(401, "Incorrect API key provided.")
        views = [self._openai_view(b) for b in reversed(self.batches.values()) if b.style == "openai"]
        return _json({"object": "list", "data": views, "has_more": False})

    async def cancel(self, request: web.Request) -> web.Response:
        b = self._batch(request, "openai")
        if isinstance(b, web.Response):
            return b
        self._cancel(b)
        return _json(self._openai_view(b))

    def _cancel(self, b: _Batch) -> None:
        self._advance(b)
        if b.status in ("validating", "in_progress"):
            b.cancelled_at = time.monotonic()
            b.status = "cancelling"

    # -- Gemini style ----------------------------------------------------------------------------------
    async def g_upload_start(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(401, "API key not valid.")
        if request.headers.get("X-Goog-Upload-Protocol") != "resumable" or request.headers.get("X-Goog-Upload-Command") != "start":
            return _error(400, "only the resumable upload protocol is supported")
        meta = orjson.loads(await request.read() or b"{}")
        sid = self._new_id("upload-")
        self.uploads[sid] = meta.get("file") or {}
        url = f"{request.scheme}://{request.host}/upload/v1beta/files/session/{sid}"
        return _json({}, headers={"X-Goog-Upload-URL": url, "X-Goog-Upload-Status": "active"})

    async def g_upload_finish(self, request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        if sid not in self.uploads or "finalize" not in request.headers.get("X-Goog-Upload-Command", ""):
            return _error(400, "unknown upload session or missing finalize")
        meta = self.uploads.pop(sid)
        data = await request.read()
        fid = self._new_id("file-")
        self.files[fid] = data
        self.stats.files_uploaded += 1
        return _json({"file": {"name": f"files/{fid}", "displayName": meta.get("display_name", ""),
                               "sizeBytes": str(len(data)), "mimeType": "application/jsonl", "state": "ACTIVE"}})

    async def g_download(self, request: web.Request) -> web.Response:
        return self._file(request, "API key not valid.")

    async def g_create(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(401, "API key not valid.")
        req = orjson.loads(await request.read())
        batch = req.get("batch") or {}
        src = (batch.get("input_config") or batch.get("inputConfig") or {})
        fname = (src.get("file_name") or src.get("fileName") or "").removeprefix("files/")
        data = self.files.get(fname)
        if data is None:
            return _error(400, f"input_config.file_name {fname!r} is not an uploaded file")
        try:
            lines = [(x["key"], gemini_to_chat(x["request"])) for x in map(orjson.loads, data.splitlines()) if x]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return _error(400, "input file is not Gemini batch JSONL (key, request)")
        model = request.match_info["model"]
        for _, body in lines:
            body["model"] = model
        meta = {"display_name": batch.get("display_name") or batch.get("displayName") or ""}
        b = self._create("gemini", fname, lines, meta, model)
        return _json(self._gemini_view(b))

    def _gemini_view(self, b: _Batch) -> dict[str, Any]:
        self._advance(b)
        done, failed = b.counts
        if b.status == "in_progress":
            done = self._progress(b, time.monotonic() - b.created)
        total = len(b.lines)
        meta = {
            "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
            "name": f"batches/{b.id}", "model": f"models/{b.model}", "displayName": b.metadata.get("display_name", ""),
            "state": _GEMINI_STATE[b.status],
            "batchStats": {"requestCount": str(total), "successfulRequestCount": str(done),
                           "failedRequestCount": str(failed), "pendingRequestCount": str(total - done - failed)},
        }
        view: dict[str, Any] = {"name": f"batches/{b.id}", "metadata": meta,
                                "done": b.status in ("completed", "failed", "expired", "cancelled")}
        if b.output_file_id:
            view["response"] = {"@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput",
                                "responsesFile": f"files/{b.output_file_id}"}
        if b.errors:
            view["error"] = {"code": 400, "message": b.errors[0]["message"], "status": "INVALID_ARGUMENT"}
        return view

    async def g_get(self, request: web.Request) -> web.Response:
        b = self._batch(request, "gemini")
        return b if isinstance(b, web.Response) else _json(self._gemini_view(b))

    async def g_list(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(401, "API key not valid.")
        return _json({"operations": [self._gemini_view(b) for b in reversed(self.batches.values()) if b.style == "gemini"]})

    async def g_cancel(self, request: web.Request) -> web.Response:
        b = self._batch(request, "gemini")
        if isinstance(b, web.Response):
            return b
        self._cancel(b)
        return _json({})

    # -- admin -----------------------------------------------------------------------------------------
    async def admin(self, request: web.Request) -> web.Response:
        knobs = orjson.loads(await request.read() or b"{}")
        base = BatchConfig() if knobs.pop("reset", False) else self.cfg
        try:
            self.cfg = dataclasses.replace(base, **knobs)
        except TypeError as e:
            return _json({"error": str(e)}, 400)
        self.rng = random.Random(self.cfg.seed)
        return _json(dataclasses.asdict(self.cfg))

    async def get_stats(self, request: web.Request) -> web.Response:
        return _json(self.stats.as_dict())

    async def reset_stats(self, request: web.Request) -> web.Response:
        self.stats = _Stats()
        return _json(self.stats.as_dict())


def register(app: web.Application, sim: Simulator) -> BatchSim:
    """Add both batch APIs and their admin routes to the simulator's app."""
    b = BatchSim(sim)
    r = app.router
    r.add_post("/v1/files", b.upload)
    r.add_get("/v1/files/{file_id}/content", b.file_content)
    r.add_post("/v1/batches", b.create)
    r.add_get("/v1/batches", b.list)
    r.add_get("/v1/batches/{batch_id}", b.retrieve)
    r.add_post("/v1/batches/{batch_id}/cancel", b.cancel)
    r.add_post("/upload/v1beta/files", b.g_upload_start)
    r.add_post("/upload/v1beta/files/session/{sid}", b.g_upload_finish)
    r.add_get("/download/v1beta/files/{file_id:[^/:]+}:download", b.g_download)
    r.add_post("/v1beta/models/{model:[^/:]+}:batchGenerateContent", b.g_create)
    r.add_get("/v1beta/batches", b.g_list)
    r.add_get("/v1beta/batches/{batch_id:[^/:]+}", b.g_get)
    r.add_post("/v1beta/batches/{batch_id:[^/:]+}:cancel", b.g_cancel)
    r.add_post("/admin/batch", b.admin)
    r.add_get("/batch/stats", b.get_stats)
    r.add_post("/batch/stats/reset", b.reset_stats)
    return b


# -- admin calls from tests and benchmarks (the simulator is another process) ---------------------------
def _call(root: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    from .harness import admin_call  # harness imports the server, which imports this module

    return admin_call(root, method, path, body)


def configure_batch(base_url: str, *, reset: bool = False, **knobs: Any) -> dict[str, Any]:
    """Set `BatchConfig` knobs of the simulator at `base_url` (a SimHandle's base_url)."""
    return _call(base_url, "POST", "/admin/batch", {"reset": reset, **knobs})


def batch_stats(base_url: str) -> dict[str, Any]:
    return _call(base_url, "GET", "/batch/stats")


def reset_batch_stats(base_url: str) -> dict[str, Any]:
    return _call(base_url, "POST", "/batch/stats/reset")
