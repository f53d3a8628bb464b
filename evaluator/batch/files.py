"""The request-file format, both ways: OpenAI batch JSONL.

Requests: `{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {chat request}}`.
Results: `{"id", "custom_id", "response": {"status_code", "body"} | null, "error": {"code", "message"} | null}`,
the format OpenAI's batch output and error files, `vllm run-batch` and this project's `requests run` write.
A file that breaks the format is a `RequestFileError` naming the file and line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..llm.errors import ConfigError
from ..schema import atomic_write

CHAT_URL = "/v1/chat/completions"


class RequestFileError(ConfigError):
    """A request or result file the user handed us is not in the format; the message names file and line."""


@dataclass
class Request:
    custom_id: str
    body: dict[str, Any]

    def line(self) -> bytes:
        return orjson.dumps({"custom_id": self.custom_id, "method": "POST", "url": CHAT_URL, "body": self.body}) + b"\n"


@dataclass
class Result:
    custom_id: str
    status_code: int | None  # None when the request never ran (expired, cancelled)
    body: dict[str, Any] | None  # the chat.completion on 200, the error body otherwise
    error: dict[str, Any] | None = None  # batch-level error: {"code", "message"}

    @property
    def ok(self) -> bool:
        return self.status_code == 200 and self.body is not None

    def as_json(self) -> dict[str, Any]:
        response = None if self.status_code is None else {"status_code": self.status_code, "body": self.body}
        return {"id": f"req_{self.custom_id[:24]}", "custom_id": self.custom_id, "response": response, "error": self.error}

    def line(self) -> bytes:
        return orjson.dumps(self.as_json()) + b"\n"

    def reason(self) -> str:
        """One line saying why this result is not a reply."""
        if self.error:
            return f"{self.error.get('code', 'error')}: {self.error.get('message', '')}".strip()
        err = (self.body or {}).get("error") if isinstance(self.body, dict) else None
        msg = err.get("message") if isinstance(err, dict) else None
        return f"HTTP {self.status_code}" + (f": {msg}" if msg else "")


def _parse(raw_lines: Iterable[bytes], where: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for n, raw in enumerate(raw_lines, 1):
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
        yield from _parse(fh, str(path))


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


def parse_results(data: bytes, where: str) -> list[Result]:
    """Results from a downloaded output or error file's bytes."""
    return _results(_parse(data.splitlines(), where), where)


def _results(lines: Iterable[tuple[int, dict[str, Any]]], where: str) -> list[Result]:
    out = []
    for n, obj in lines:
        cid = obj.get("custom_id")
        if not isinstance(cid, str):
            raise RequestFileError(f"{where}:{n}: missing \"custom_id\"; is this a results file (not a request file)?")
        resp = obj.get("response")
        if resp is not None and not isinstance(resp, dict):
            raise RequestFileError(f"{where}:{n}: \"response\" must be an object or null")
        status = resp.get("status_code") if resp else None
        if status is not None and (isinstance(status, bool) or not isinstance(status, int)):
            raise RequestFileError(f"{where}:{n}: \"response.status_code\" must be an integer")
        out.append(Result(cid, int(status) if status is not None else None, resp.get("body") if resp else None, obj.get("error")))
    return out


def write_lines(path: Path | str, items: Iterable[Request | Result]) -> int:
    """Write atomically: a reader never sees half a file, a kill leaves the old one. Returns the count."""
    lines = [it.line() for it in items]
    atomic_write(Path(path), b"".join(lines))
    return len(lines)


def split(requests: list[Request], max_requests: int | None, max_bytes: int | None) -> list[list[Request]]:
    """Consecutive chunks that each stay within both limits (None = no limit)."""
    chunks: list[list[Request]] = []
    cur: list[Request] = []
    size = 0
    for r in requests:
        n = len(r.line())
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
