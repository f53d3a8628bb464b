"""A small study against a real OpenAI-compatible server, then a rerun that must send nothing.

Skipped unless EVALUATOR_REAL_BASE_URL (e.g. http://127.0.0.1:8080/v1) and EVALUATOR_REAL_MODEL name a
running server: llama.cpp, vLLM, SGLang or Ollama. It runs the CLI with the shipped `local` profile,
so what is checked is the path a user takes. Optional:
- EVALUATOR_REAL_ARGS: extra CLI flags, e.g. "--max-tokens 256 --timeout 300";
- EVALUATOR_REAL_STRUCTURED: the profile's `structured` mode instead of local.toml's ("json_object_schema"
  for llama-cpp-python's server);
- EVALUATOR_REAL_DATA / EVALUATOR_REAL_SUBSETS: the data folder and subsets (default: the bundled MCP
  example registry, examples/mcp, subset "single": 38 tools embed in seconds, where ToolBench's 47k
  APIs take ~10 minutes on 2 cores the first time); EVALUATOR_REAL_EMBED_CACHE: a cache root whose
  embeddings/ is copied first;
- EVALUATOR_REAL_TIMEOUT: seconds one study may take (default 3600).
A tiny model's answers are poor; the assertions are about the pipeline, not the answers.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO
from helpers.cli import run_cli
from helpers.records import flat

BASE_URL = os.environ.get("EVALUATOR_REAL_BASE_URL", "")
MODEL = os.environ.get("EVALUATOR_REAL_MODEL", "")
pytestmark = pytest.mark.skipif(
    not (BASE_URL and MODEL), reason="set EVALUATOR_REAL_BASE_URL and EVALUATOR_REAL_MODEL to run against a real server"
)


def _profile(root: Path) -> str:
    """`local`, or a copy of it with EVALUATOR_REAL_STRUCTURED as its `structured` mode (named `local` too)."""
    mode = os.environ.get("EVALUATOR_REAL_STRUCTURED")
    if not mode:
        return "local"
    text = (REPO / "configs" / "models" / "local.toml").read_text(encoding="utf-8")
    text = re.sub(r'(?m)^structured = ".*"$', f'structured = "{mode}"', text)
    path = root / "local.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def _study(profile: str, cache: Path, out: Path) -> dict[str, Any]:
    cmd = [
        "--model", profile,
        "--data", os.environ.get("EVALUATOR_REAL_DATA", str(REPO / "examples" / "mcp")),
        "--subsets", os.environ.get("EVALUATOR_REAL_SUBSETS", "single"), "--limit", "5", "--runs", "2",
        "--no-extras", "--no-progress", "--cache-dir", str(cache), "--out", str(out),
        *shlex.split(os.environ.get("EVALUATOR_REAL_ARGS", "")),
    ]
    done = run_cli(*cmd, env={"LOCAL_BASE_URL": BASE_URL, "LOCAL_MODEL": MODEL},
                   timeout=float(os.environ.get("EVALUATOR_REAL_TIMEOUT", "3600")))
    assert done.returncode == 0, done.stderr[-3000:]
    meta = json.loads((out / "meta.json").read_text())
    records = [flat(json.loads(line)) for line in (out / "queries.jsonl").read_text().splitlines() if line.strip()]
    return {"meta": meta, "records": records, "stderr": done.stderr}


def _llm_stats(meta: dict[str, Any]) -> dict[str, Any]:
    stats = meta.get("llm_stats") or meta.get("llm", {}).get("stats") or {}
    assert "local" in stats, f"no LLM stats for 'local' in meta.json: {sorted(meta)}"
    return stats["local"]


def _key(rec: dict[str, Any]) -> tuple:
    return (str(rec.get("subset")), str(rec.get("query_id")), str(rec.get("model")), int(rec.get("run", 0)))


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("real")
    cache = root / "cache"
    seed = os.environ.get("EVALUATOR_REAL_EMBED_CACHE")
    if seed and (Path(seed) / "embeddings").is_dir():
        shutil.copytree(Path(seed) / "embeddings", cache / "embeddings")
    profile = _profile(root)
    return {"first": _study(profile, cache, root / "first"), "rerun": _study(profile, cache, root / "rerun")}


def test_the_study_completes_against_the_server(studies: dict[str, dict[str, Any]]) -> None:
    first = studies["first"]
    stats = _llm_stats(first["meta"])
    assert len(first["records"]) == 5 * 2  # one subset, --limit 5, --runs 2
    # RtP planner and PtR discovery per query and run (PtR's planner only when discovery gave stubs)
    assert stats["requests"] > 0 and stats["calls"] >= 5 * 2 * 2
    # Every call got an answer from the server: none ended in an error or a timeout.
    assert stats["errors"] == 0 and stats["timeouts"] == 0
    for rec in first["records"]:
        assert rec["rtp"]["plan"]["llm_error"] is None
        assert rec["ptr"]["discovery_llm_error"] is None


def test_rerun_sends_no_request_and_gives_identical_results(studies: dict[str, dict[str, Any]]) -> None:
    first, rerun = studies["first"], studies["rerun"]
    stats = _llm_stats(rerun["meta"])
    assert stats["requests"] == 0
    assert stats["cache_hits"] == stats["calls"] == _llm_stats(first["meta"])["calls"]
    a = sorted(first["records"], key=_key)
    b = sorted(rerun["records"], key=_key)
    assert a == b
