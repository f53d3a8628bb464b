"""`python -m evaluator arch check FILE.py:Class`: a plugin tried on the bundled example registry against the
simulator in seconds, as its author would: each query's list, trace, own calls and any breach printed; a plugin
with a structured prompt of its own gets JSON valid against its schema back and its parser's output shows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import REPO
from helpers.cli import run_cli


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("archcheck") / "cache"


def _check(cache: Path, spec: str, *extra: str):
    return run_cli("arch", "check", spec, "--cache-dir", str(cache), "--no-progress", *extra, cwd=REPO)


def _queries(out: str) -> list[str]:
    """The printed block of each query."""
    return re.split(r"\n\n(?=(?:single|multi) query )", out.split("\n\n", 1)[1].rsplit("\n\n", 1)[0])


def test_the_example_plugin_on_the_example_registry(cache: Path) -> None:
    r = _check(cache, "examples/arch_plugin/clauses.py:Clauses")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    head = r.stdout.splitlines()[0]
    assert head.startswith("arch check examples/arch_plugin/clauses.py:Clauses (name 'clauses'): 6 queries of ")
    assert "examples/mcp (38 APIs), retriever dense, model sim (simulated; schemas sent as json_schema)" in head
    blocks = _queries(r.stdout)
    assert len(blocks) == 6  # the first 3 of each subset
    for block in blocks:
        assert re.search(r"^  list \(\d+\): 1\. \S+::\S+ \(", block, re.M), block
        assert '"clauses": [' in block and "planner selected: " in block
    assert r.stdout.rstrip().endswith("6 of 6 queries kept the contract.")


def test_a_structured_prompt_is_answered_and_parsed_offline(cache: Path) -> None:
    r = _check(cache, "examples/arch_plugin/subqueries.py:SubQueries", "--limit", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    blocks = _queries(r.stdout)
    assert len(blocks) == 4
    for block in blocks:
        reply = re.search(r"^  call subqueries-v1 \(schema sent\): reply (.*)$", block, re.M)
        assert reply is not None, block
        sent = json.loads(reply.group(1))  # the simulator's answer: JSON valid against the plugin's schema
        assert set(sent) == {"queries"} and 1 <= len(sent["queries"]) <= 5
        trace = json.loads(block.split("  trace: ", 1)[1].split("\n  planner", 1)[0])
        assert trace == {"queries": sent["queries"], "parse_error": None}  # what the plugin's parser made of it
    # without the schema sent (structured none), the simulator's prose is no JSON: the plugin says so, retrieves
    # nothing and asks no planner
    r = _check(cache, "examples/arch_plugin/subqueries.py:SubQueries", "--limit", "1", "--structured", "none")
    assert r.returncode == 0, r.stderr[-2000:]
    for block in _queries(r.stdout):
        assert "list (0): nothing retrieved" in block and '"parse_error": "no JSON found in reply"' in block


def test_a_breach_is_shown_per_query_and_exits_5(cache: Path, tmp_path: Path) -> None:
    (tmp_path / "half.py").write_text(
        "from evaluator.study.archs import Discovery\n"
        "class Half:\n    name = 'half'\n    async def retrieve(self, ctx):\n"
        "        found = await ctx.search([ctx.text], retriever='bm25')\n"
        "        if ctx.subset == 'multi':\n"
        "            return Discovery(found.merged.ids, [float('inf')] * len(found.merged.ids))\n"
        "        return Discovery(found.merged.ids, trace={'registry': len(ctx.registry)})\n", encoding="utf-8")
    r = _check(cache, f"{tmp_path / 'half.py'}:Half", "--limit", "2")
    assert r.returncode == 5 and "Traceback" not in r.stderr, r.stderr[-2000:]
    blocks = _queries(r.stdout)
    assert [("FAILED (contract): Discovery.scores[0] is inf, not a finite number" in b) for b in blocks] == \
        [False, False, True, True]
    assert all('"registry": 38' in b for b in blocks[:2])  # the registry, without reading a file
    assert r.stdout.rstrip().endswith("2 of 4 queries kept the contract; failed: 2 (contract): a study leaves "
                                      "those blocks out and exits 5")


def test_a_plugin_that_does_not_load_is_one_line(cache: Path, tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("class Bad:\n    name = 'bad'\n", encoding="utf-8")
    r = _check(cache, f"{tmp_path / 'bad.py'}:Bad")
    err = r.stderr.strip()
    assert r.returncode == 2 and "\n" not in err and "no method retrieve" in err, err
    r = _check(cache, "rtp")
    assert r.returncode == 2 and "name a plugin as path/to/file.py:ClassName" in r.stderr
