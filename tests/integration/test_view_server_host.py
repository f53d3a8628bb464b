"""`view --serve` answers only the Host it bound (issue 38): a request naming another host, as a page of another
site does after pointing its own name at 127.0.0.1 (DNS rebinding), gets 403 and not the results."""

from __future__ import annotations

import http.client
import threading

from evaluator.cli import view_server


def _get(port: int, host: str | None, path: str = "/") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("GET", path, skip_host=True)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_only_the_bound_address_and_port_are_answered(tmp_path):
    srv = view_server.server("<html>the results</html>", 0, tmp_path / "view.html")
    port = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert _get(port, f"127.0.0.1:{port}") == (200, b"<html>the results</html>")
        for other in ("attacker.example", f"attacker.example:{port}", f"localhost:{port}", f"127.0.0.1:{port + 1}",
                      "127.0.0.1", "", None):
            status, body = _get(port, other)
            assert status == 403 and b"results" not in body, other
            assert f"http://127.0.0.1:{port}/".encode() in body
        status, _ = _get(port, f"attacker.example:{port}", "/view-data/part-0000.js")
        assert status == 403
    finally:
        srv.shutdown()
        srv.server_close()
