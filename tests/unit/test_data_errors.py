"""Bad input files: each ends in one DataError line naming the file, the line or record, and what was
expected; whatever the damage (encoding, compression, syntax, types), never a traceback or a partial load."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from evaluator.core.errors import DataError
from evaluator.data import load_query_files, load_registry

GOOD_TOOL = {"name": "ping", "description": "Check a host", "inputSchema": {"type": "object", "properties": {}}}
GOOD_QUERY = {"query": "ping it", "gold": ["net::ping"]}


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


# (file name, bytes, pattern the one-line message must match)
REGISTRY_CASES = {
    "invalid utf-8": ("net.json", b'{"tools": [{"name": "p\xffing"}]}', r"net\.json: not valid UTF-8 at byte 22 \(line 1\)"),
    "invalid utf-8 in gzip": ("apis.jsonl.gz", gz(b'{"tool_name": "a", "api_name": "b"}\n{"x": "\xc3"}\n'),
                              r"apis\.jsonl\.gz: not valid UTF-8 at byte 43 of the decompressed text \(line 2\)"),
    "truncated gzip": ("apis.jsonl.gz", gz(b'{"tool_name": "a", "api_name": "b"}\n' * 50)[:40],
                       r"apis\.jsonl\.gz: damaged gzip file \(.+\); re-download"),
    "corrupt gzip crc": ("apis.jsonl.gz", gz(b'{"tool_name": "a", "api_name": "b"}\n')[:-8] + b"\0" * 8,
                         r"apis\.jsonl\.gz: damaged gzip file"),
    "not gzip at all": ("apis.jsonl.gz", b'{"tool_name": "a", "api_name": "b"}\n', r"not a gzip file although it ends in \.gz"),
    "malformed json": ("net.json", b'{"tools": [\n  {"name": "ping",}\n]}', r"net\.json:2: malformed JSON .*column"),
    "malformed jsonl line": ("apis.jsonl", b'{"tool_name": "a", "api_name": "b"}\n{"tool_name": \n', r"apis\.jsonl:2: malformed JSON"),
    "jsonl line not an object": ("apis.jsonl", b'{"tool_name": "a", "api_name": "b"}\n[1, 2]\n', r"apis\.jsonl:2: expected a JSON object, got a list"),
    "name of wrong type": ("net.json", json.dumps({"tools": [GOOD_TOOL, {**GOOD_TOOL, "name": 5}]}).encode(),
                           r"net\.json tools\[1\]: 'name' must be a string, not a number"),
    "empty name": ("net.json", json.dumps({"tools": [{**GOOD_TOOL, "name": " "}]}).encode(), r"tools\[0\]: 'name' is empty"),
    "schema of wrong type": ("net.json", json.dumps({"tools": [{**GOOD_TOOL, "inputSchema": "none"}]}).encode(),
                             r"tools\[0\]: 'inputSchema' must be a JSON Schema object, not a string"),
    "properties of wrong type": ("net.json", json.dumps({"tools": [{**GOOD_TOOL, "inputSchema": {"properties": []}}]}).encode(),
                                 r"tools\[0\]: 'inputSchema\.properties' must be an object"),
    "tools not a list": ("net.json", json.dumps({"server": "net", "tools": {"ping": GOOD_TOOL}}).encode(), r"net\.json: 'tools' must be a list"),
    "server of wrong type": ("net.json", json.dumps({"server": 3, "tools": [GOOD_TOOL]}).encode(), r"'server' must be the server's name"),
    "a bare number": ("net.json", b"42", r"net\.json: expected a JSON object or list of tool definitions, got a number"),
    "non-function openai tool": ("web.json", json.dumps([{"type": "web_search"}]).encode(), r"web\.json record 0: cannot tell|only function tools"),
    "deeply nested": ("net.json", b"[" * 100000 + b"]" * 100000, r"net\.json: .*nested too deeply"),
    "empty registry": ("net.json", b'{"tools": []}', r"net\.json: the registry holds no API"),
    "empty file": ("net.json", b"  \n", r"net\.json: the file is empty; expected a JSON list or object of tool definitions"),
    "jsonl missing api_name": ("apis.jsonl", b'{"tool_name": "a"}\n', r"apis\.jsonl:1: missing the string field 'api_name'"),
    "description of wrong type": ("apis.jsonl", b'{"tool_name": "a", "api_name": "b", "api_description": 3}\n',
                                  r"apis\.jsonl:1: 'api_description' must be a string, not a number"),
}


@pytest.mark.parametrize("case", sorted(REGISTRY_CASES))
def test_bad_registry_file_is_one_located_line(tmp_path, case):
    name, data, pattern = REGISTRY_CASES[case]
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(DataError) as e:
        load_registry(p)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg
    assert re.search(pattern, msg), msg


QUERY_CASES = {
    "csv without header": ("q.csv", b"what time is it,time::now\n", r"q\.csv:1: expected a header row naming the columns query, gold"),
    "csv extra cells": ("q.csv", b"query,gold\nping it,net::ping,extra\n", r"q\.csv:2: 3 cells but the header has 2; quote cells"),
    "csv empty query": ("q.csv", b"query,gold\n ,net::ping\n", r"q\.csv:2: 'query' is empty"),
    "csv duplicate column": ("q.csv", b"query,gold,gold\nx,net::ping,net::ping\n", r"q\.csv:1: column 'gold' appears twice"),
    "jsonl missing gold": ("q.jsonl", json.dumps({"query": "x"}).encode() + b"\n", r"q\.jsonl:1: missing 'gold'"),
    "gold of wrong type": ("q.jsonl", json.dumps({"query": "x", "gold": 5}).encode() + b"\n", r"q\.jsonl:1: 'gold' must be a list of API ids"),
    "gold entry of wrong type": ("q.jsonl", json.dumps({"query": "x", "gold": [["net", "ping"]]}).encode() + b"\n",
                                 r"q\.jsonl:1: 'gold' entries must be API id strings"),
    "boolean id": ("q.jsonl", json.dumps({**GOOD_QUERY, "id": True}).encode() + b"\n", r"q\.jsonl:1: a query id must be a string or a number, not a boolean"),
    "object id": ("q.jsonl", json.dumps({**GOOD_QUERY, "id": {"n": 1}}).encode() + b"\n", r"q\.jsonl:1: a query id must be"),
    "subset of wrong type": ("q.jsonl", json.dumps({**GOOD_QUERY, "subset": 1}).encode() + b"\n", r"'subset' must be a string"),
    "toolbench relevant not pairs": ("G1_instruction.json", json.dumps([{"query_id": 1, "query": "x", "api_list": [],
                                     "relevant APIs": ["net::ping"]}]).encode(), r"G1_instruction\.json record 0: expected .*pair"),
    "toolbench api_list entry": ("G1_instruction.json", json.dumps([{"query_id": 1, "query": "x", "api_list": [{"tool_name": "A"}],
                                 "relevant APIs": []}]).encode(), r"G1_instruction\.json record 0: expected .*\(missing 'api_name'\)"),
    "toolbench id a list": ("G1_instruction.json", json.dumps([{"query_id": [1], "query": "x", "api_list": [], "relevant APIs": []}]).encode(),
                            r"record 0: a query id must be a string or a number, not a list"),
    # An empty request is an error in every query format (ToolBench's scored it before).
    "toolbench empty query": ("G1_instruction.json", json.dumps([{"query_id": 1, "query": "", "api_list": [], "relevant APIs": []}]).encode(),
                              r"G1_instruction\.json record 0: 'query' is empty"),
    "toolbench blank query jsonl": ("G1.jsonl", json.dumps({"query_id": 1, "query": " \n\t", "api_list": [], "relevant APIs": []}).encode() + b"\n",
                                    r"G1\.jsonl:1: 'query' is empty"),
    "jsonl empty query": ("q.jsonl", json.dumps({"query": "  ", "gold": ["net::ping"]}).encode() + b"\n", r"q\.jsonl:1: 'query' is empty"),
    "query file an object": ("G1_instruction.json", b'{"query": "x"}', r"expected a JSON list of queries"),
    "query file invalid utf-8": ("q.csv", b"query,gold\ncaf\xe9,net::ping\n", r"q\.csv: not valid UTF-8 at byte 14 \(line 2\)"),
    "query file truncated gzip": ("q.jsonl.gz", gz(json.dumps(GOOD_QUERY).encode() * 20)[:30], r"q\.jsonl\.gz: damaged gzip file"),
}


@pytest.mark.parametrize("case", sorted(QUERY_CASES))
def test_bad_query_file_is_one_located_line(tmp_path, case):
    name, data, pattern = QUERY_CASES[case]
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(DataError) as e:
        load_query_files([p])
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg
    assert re.search(pattern, msg), msg


def test_paths_that_are_not_files(tmp_path):
    with pytest.raises(DataError, match=r"nope: no such file or folder"):
        load_registry(tmp_path / "nope")
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file or folder"):
        load_query_files([tmp_path / "nope.jsonl"])
    (tmp_path / "dir").mkdir()
    with pytest.raises(DataError, match=r"No query files under .*dir: expected a queries/ folder"):
        load_query_files([tmp_path / "dir"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"No registry found under .*empty"):
        load_registry(tmp_path / "empty")


def test_one_bad_file_in_a_folder_loads_nothing(tmp_path):
    d = tmp_path / "tools"
    d.mkdir()
    (d / "a.json").write_text(json.dumps({"tools": [GOOD_TOOL]}))
    (d / "b.json").write_text(json.dumps({"tools": [GOOD_TOOL, {"description": "no name"}]}))
    with pytest.raises(DataError, match=r"b\.json tools\[1\]: missing the string field 'name'"):
        load_registry(d)
