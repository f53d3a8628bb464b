"""`view --serve`: an HTTP server on 127.0.0.1 for one viewer page and its own parts, nothing else of the folder.

It answers only requests whose `Host` is the address it bound and its port (`127.0.0.1:PORT`), 403 to any other:
a page of another site that points a name of its own at 127.0.0.1 (DNS rebinding) sends its own name as the Host,
so it cannot read the results.
"""

from __future__ import annotations

import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

from evaluator.render.view_page import VIEW_FILE, parts_folder


class _PageHandler(BaseHTTPRequestHandler):
    page: bytes = b""
    parts: Path | None = None  # the page's parts folder (a paged page loads them)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        host, port = cast(tuple[str, int], self.server.server_address)[:2]
        if self.headers.get("Host", "").strip().lower() not in {f"{host}:{port}", *([str(host)] if port == 80 else [])}:
            self._answer(403, f"forbidden: this viewer answers http://{host}:{port}/ only".encode(), "text/plain")
            return
        # Only the page and its own parts: serving its folder would expose every other file in it.
        path = self.path.split("?")[0]
        body, kind = self.page, "text/html; charset=utf-8"
        if path not in ("/", "/" + VIEW_FILE):
            parts = self.parts
            part = parts / path.rsplit("/", 1)[-1] if parts is not None else None
            if (parts is not None and part is not None and part.is_file()
                    and re.fullmatch(rf"/{re.escape(parts.name)}/part-\d{{4}}\.js", path) is not None):
                body, kind = part.read_bytes(), "text/javascript; charset=utf-8"
            else:
                body, kind = b"not found", "text/plain"
        self._answer(200 if kind != "text/plain" else 404, body, kind)

    def _answer(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # the command prints the address once; no line per request


def server(html: str, port: int = 0, page_path: Path | None = None) -> ThreadingHTTPServer:
    """A server for one page and its parts; the caller runs `serve_forever`."""
    parts = page_path.parent / parts_folder(page_path.name) if page_path is not None else None
    handler = type("Handler", (_PageHandler,), {"page": html.encode("utf-8"), "parts": parts})
    return ThreadingHTTPServer(("127.0.0.1", port), handler)
