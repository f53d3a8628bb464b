"""`requests import` of a damaged results file takes every good line and names the bad ones (issue 38).

Before the fix a results file cut mid-line (a copy interrupted, a full disk) imported nothing: 250 good replies
were dropped for one bad line.
"""

from __future__ import annotations

import orjson
import pytest

from evaluator.batch.request_format import RequestFileError, read_results_salvaged  # noqa: E402
from evaluator.cli import main as cli  # noqa: E402
from evaluator.llm.cache import ResponseCache  # noqa: E402


def _line(i: int) -> bytes:
    body = {"id": f"c{i}", "object": "chat.completion", "model": "sim-1",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": f"reply {i}"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
    return orjson.dumps({"id": f"r{i}", "custom_id": f"key-{i:04d}", "response": {"status_code": 200, "body": body},
                         "error": None}) + b"\n"


def test_a_file_cut_mid_line_imports_its_good_lines_and_names_the_bad(tmp_path, capsys):
    lines = [_line(i) for i in range(300)]
    lines[99] = b'{"custom_id": "key-0099", "respo\x00\x00garbage\n'  # a line written over
    data = b"".join(lines[:250]) + lines[250][: len(lines[250]) // 2]  # cut in the middle of line 251
    path = tmp_path / "results.jsonl"
    path.write_bytes(data)
    cache = tmp_path / "cache"
    rc = cli.main(["requests", "import", str(path), "--model", "sim", "--cache-dir", str(cache)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "Imported 249 replies" in out
    warn = [ln for ln in err.splitlines() if ln.strip()]
    assert len(warn) == 1 and "2 line(s) of the results could not be read and were skipped" in warn[0]
    assert f"{path}:100: not a JSON object" in warn[0] and f"{path}:251: not a JSON object" in warn[0]
    assert "ends mid-line" in warn[0]
    db = ResponseCache(cache)
    try:
        assert db.get("key-0000").content == "reply 0" and db.get("key-0249").content == "reply 249"
        assert db.get("key-0099") is None and db.get("key-0250") is None
    finally:
        db.close()


def test_a_file_with_no_good_line_is_one_line(tmp_path):
    path = tmp_path / "requests.jsonl"
    path.write_bytes(b"not json at all\n{\n")
    with pytest.raises(RequestFileError, match=r"requests\.jsonl:1: not a JSON object"):
        read_results_salvaged(path)
