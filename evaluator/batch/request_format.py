"""The request-file format, both ways: OpenAI batch JSONL.

Requests: `{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {chat request}}`.
Results: `{"id", "custom_id", "response": {"status_code", "body"} | null, "error": {"code", "message"} | null}`,
the format OpenAI's batch output and error files, `vllm run-batch` and this project's `requests run` write.
`vllm run-batch` writes a failed line's `error` as a plain string or as its `ErrorResponse` object (flat
`{"object": "error", "message", "type", "code"}` or nested `{"error": {...}}`) beside a `response` with a
status and no body; every form is read into one `{"code", "message"}` shape (tests/fixtures/providers/).
A file that breaks the format is a `RequestFileError` naming the file and line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from evaluator.core.errors import ConfigError
from evaluator.core.redact import redact, redact_keys
from evaluator.results.schema import atomic_write

CHAT_URL = "/v1/chat/completions"


class RequestFileError(ConfigError):
    """A request or result file the user handed us is not in the format; the message names file and line."""


@dataclass(frozen=True)
class BatchFailure:
    """Why a result line, or a whole batch, is not a reply: one shape whatever the provider wrote."""

    code: str | int | None  # OpenAI's string code, vLLM's HTTP code, a gRPC status name; None if none given
    message: str

    def as_json(self) -> dict[str, str | int | None]:
        return {"code": self.code, "message": self.message}


@dataclass
class Request:
    custom_id: str
    # A deliberate extension point: the provider's chat request body, passed through as the caller built
    # it (model, messages, response_format and every `extra_body` field a provider may define).
    body: dict[str, Any]

    def line(self) -> bytes:
        return orjson.dumps({"custom_id": self.custom_id, "method": "POST", "url": CHAT_URL, "body": self.body}) + b"\n"


@dataclass
class Result:
    custom_id: str
    status_code: int | None  # None when the request never ran (expired, cancelled)
    # A deliberate extension point: the provider's reply body as it came (a chat.completion on 200, the
    # provider's error body otherwise), handed to the engine's reply parser unchanged.
    body: dict[str, Any] | None
    error: BatchFailure | None = None  # why it is not a reply (see `error_dict`)

    @property
    def ok(self) -> bool:
        return self.status_code == 200 and self.body is not None and not self.error

    def kind(self) -> str:
        """A short label to count failures by: "ok", "HTTP 400", "batch_expired", ..."""
        if self.ok:
            return "ok"
        if self.status_code is not None and self.status_code != 200:
            return f"HTTP {self.status_code}"
        code = self.error.code if self.error else None
        return str(code) if code not in (None, "") else "no reply"

    def as_json(self) -> dict[str, Any]:
        response = None if self.status_code is None else {"status_code": self.status_code, "body": self.body}
        error = None if self.error is None else self.error.as_json()
        return {"id": f"req_{self.custom_id[:24]}", "custom_id": self.custom_id, "response": response, "error": error}

    def line(self) -> bytes:
        return orjson.dumps(self.as_json()) + b"\n"

    def reason(self) -> str:
        """One line saying why this result is not a reply (a server may echo the key in it: redacted)."""
        err = (self.body or {}).get("error") if isinstance(self.body, dict) else None
        msg = err.get("message") if isinstance(err, dict) else None
        if self.error:
            msg = msg or self.error.message
            if self.status_code is None or self.status_code == 200:  # never ran, or an error beside a 200
                return redact(f"{self.error.code or 'error'}: {msg or ''}".strip().rstrip(":"))
        return redact(f"HTTP {self.status_code}" + (f": {msg}" if msg else ""))


def error_dict(error: object) -> BatchFailure | None:
    """A result line's `error` as a `BatchFailure`: OpenAI's {"code", "message"}; vLLM's plain string or its
    `ErrorResponse` (flat, or nested under "error") unwrapped; None when the line carries none. Other
    fields of the provider's object (type, param, line) are not kept."""
    if error is None or error == "" or error == {}:
        return None
    if isinstance(error, str):
        return BatchFailure(None, error)
    if not isinstance(error, dict):
        return BatchFailure(None, str(error))
    inner = error.get("error")
    if isinstance(inner, dict):  # vLLM >= 0.10: ErrorResponse(error=ErrorInfo(message, type, param, code))
        error = inner
    code = error.get("code")
    if code in (None, ""):
        code = error.get("type")
    return BatchFailure(code if isinstance(code, str | int) and not isinstance(code, bool) else None,
                      str(error.get("message") or ""))


def failure_kinds(results: Iterable[Result]) -> dict[str, int]:
    """How many results are not replies, by `Result.kind` (most frequent first)."""
    return dict(Counter(r.kind() for r in results if not r.ok).most_common())


def json_lines(raw_lines: Iterable[bytes], where: str, first: int = 1) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of each non-blank line; a line that is not a JSON object is one error naming it."""
    for n, raw in enumerate(raw_lines, first):
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise RequestFileError(f"{where}:{n}: not a JSON object (one request per line)") from None
        if not isinstance(obj, dict):
            raise RequestFileError(f"{where}:{n}: not a JSON object (one request per line)")
        yield n, obj


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        fh = path.open("rb")
    except OSError as e:
        raise RequestFileError(f"cannot read {path}: {e.strerror}") from None
    with fh:
        yield from json_lines(fh, str(path))


def read_requests(path: Path | str) -> list[Request]:
    """Every request of an OpenAI batch JSONL file; custom_ids must be present and unique."""
    path = Path(path)
    out: list[Request] = []
    seen: set[str] = set()
    for n, obj in _lines(path):
        cid, body = obj.get("custom_id"), obj.get("body")
        if not isinstance(cid, str) or not cid:
            raise RequestFileError(f"{path}:{n}: missing \"custom_id\" (a string naming the request)")
        if cid in seen:
            raise RequestFileError(f"{path}:{n}: custom_id {cid!r} appears twice; each request needs its own")
        url = obj.get("url", CHAT_URL)
        if not isinstance(url, str) or url.rstrip("/") not in (CHAT_URL, "/chat/completions"):
            raise RequestFileError(f"{path}:{n}: url {url!r} is not supported; only {CHAT_URL}")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise RequestFileError(f"{path}:{n}: \"body\" must be a chat request with a \"messages\" list")
        seen.add(cid)
        out.append(Request(cid, body))
    return out


def read_results(path: Path | str) -> list[Result]:
    """Every line of a results file (OpenAI batch output/error file, `vllm run-batch`, `requests run`)."""
    return _results(_lines(Path(path)), str(path))


class Salvaged(NamedTuple):
    results: list[Result]
    bad: list[str]  # the first bad lines, as "FILE:N: why"
    n_bad: int  # how many lines were bad


def read_results_salvaged(path: Path | str, keep: int = 5) -> Salvaged:
    """Every good line of a results file that may be damaged (cut mid-line by a copy or a full disk, a line written
    over): (the results, the first `keep` bad lines as "FILE:N: why", how many lines were bad). A file with no good
    line at all is no results file: its first bad line is the one-line error, as `read_results` says it."""
    path = Path(path)
    out: list[Result] = []
    bad: list[str] = []
    n_bad = 0
    try:
        fh = path.open("rb")
    except OSError as e:
        raise RequestFileError(f"cannot read {path}: {e.strerror}") from None
    with fh:
        for n, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                out += _results(json_lines([raw], str(path), first=n), str(path))
            except RequestFileError as e:
                n_bad += 1
                if len(bad) < keep:
                    bad.append(str(e) + ("" if raw.endswith(b"\n") else " (the file ends mid-line: cut short?)"))
    if bad and not out:
        raise RequestFileError(bad[0])
    return Salvaged(out, bad, n_bad)


def parse_results(data: bytes, where: str) -> list[Result]:
    """Results from a downloaded output or error file's bytes."""
    return _results(json_lines(data.splitlines(), where), where)


def _results(lines: Iterable[tuple[int, dict[str, Any]]], where: str) -> list[Result]:
    return [_result(n, obj, where) for n, obj in lines]


def _result(n: int, obj: dict[str, Any], where: str) -> Result:
    cid = obj.get("custom_id")
    if not isinstance(cid, str):
        raise RequestFileError(f"{where}:{n}: missing \"custom_id\"; is this a results file (not a request file)?")
    resp = obj.get("response")
    if resp is not None and not isinstance(resp, dict):
        raise RequestFileError(f"{where}:{n}: \"response\" must be an object or null")
    status = resp.get("status_code") if resp else None
    if status is not None and (isinstance(status, bool) or not isinstance(status, int)):
        raise RequestFileError(f"{where}:{n}: \"response.status_code\" must be an integer")
    body = resp.get("body") if resp else None
    if body is not None and not isinstance(body, dict):
        raise RequestFileError(f"{where}:{n}: \"response.body\" must be an object or null")
    return Result(cid, int(status) if status is not None else None, body, error_dict(obj.get("error")))


def _content(r: Result) -> bytes:
    """What a result says, without what differs between two copies of one answer (ids, timestamps)."""
    body = r.body if isinstance(r.body, dict) else {}
    if r.ok:
        return orjson.dumps(["ok", body.get("choices")], option=orjson.OPT_SORT_KEYS)
    return orjson.dumps(["error"])  # copies of an error say the same thing: the request must be made again


def dedupe(results: Iterable[Result]) -> tuple[list[Result], list[str]]:
    """One result per custom_id, and the custom_ids whose copies disagree.

    Copies with the same content collapse into the first. When copies of a custom_id differ (a damaged
    or tampered output file), neither is trusted: the custom_id is left out and returned, so its request
    is made again instead of the first copy winning silently.
    """
    first: dict[str, Result] = {}
    conflicts: dict[str, None] = {}
    for r in results:
        prior = first.setdefault(r.custom_id, r)
        if prior is not r and _content(prior) != _content(r):
            conflicts[r.custom_id] = None
    return [r for cid, r in first.items() if cid not in conflicts], list(conflicts)


def write_lines(path: Path | str, items: Iterable[Request | Result]) -> int:
    """Write atomically: a reader never sees half a file, a kill leaves the old one. Returns the count."""
    lines = [it.line() for it in items]
    atomic_write(Path(path), redact_keys(b"".join(lines)))  # no configured key lands in a request/result file
    return len(lines)


def split(
    requests: list[Request], max_requests: int | None, max_bytes: int | None,
    size_of: Callable[[Request], int] | None = None,
) -> list[list[Request]]:
    """Consecutive chunks that each stay within both limits (None = no limit). `size_of` is a request's
    size in the uploaded file (a provider's own line format); by default its OpenAI batch line."""
    chunks: list[list[Request]] = []
    cur: list[Request] = []
    size = 0
    for r in requests:
        n = size_of(r) if size_of is not None else len(r.line())
        if max_bytes is not None and n > max_bytes:
            raise RequestFileError(f"request {r.custom_id!r} alone is {n} bytes, over the provider's {max_bytes} per batch")
        if cur and ((max_requests and len(cur) >= max_requests) or (max_bytes is not None and size + n > max_bytes)):
            chunks.append(cur)
            cur, size = [], 0
        cur.append(r)
        size += n
    if cur:
        chunks.append(cur)
    return chunks
