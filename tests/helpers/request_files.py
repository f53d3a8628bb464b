"""Request files for `requests run` tests (tests/integration/test_batch_requests.py, test_ray_engine.py): a file
of `n` distinct chat requests, and how many of them the response cache already answers."""

from __future__ import annotations

import json
from pathlib import Path

from evaluator.llm import LLMEngine


def write_requests(path: Path, n: int) -> list[dict]:
    lines = [{"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "sim-1", "temperature": 0,
                       "messages": [{"role": "user", "content": f"Find the weather forecast for city number {i}"}]}}
             for i in range(n)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return lines


def cached_count(profile, root: Path, lines: list[dict], api_key: str | None = None) -> int:
    engine = LLMEngine(profile, cache_root=root) if api_key is None else LLMEngine(profile, cache_root=root,
                                                                                   api_key=api_key)
    try:
        return sum(engine.lookup(engine.prepare_body(x["body"]).key) is not None for x in lines)
    finally:
        engine.close_cache()
