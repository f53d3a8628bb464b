"""Which data folder to read: `--data`, else `EVALUATOR_DATA`, else the config's `data.dir`."""

from __future__ import annotations

import os
from pathlib import Path

from evaluator.core.errors import DataError


def resolve_data_dir(cli: str | None, configured: str | None, base: Path) -> Path:
    """`--data`, else `EVALUATOR_DATA`, else the config (relative to the repository root)."""
    tried: list[str] = []
    for label, value in (("--data", cli), ("EVALUATOR_DATA", os.environ.get("EVALUATOR_DATA")), ("config data.dir", configured)):
        if not value:
            continue
        p = Path(value).expanduser()
        candidates = [p] if p.is_absolute() else [Path.cwd() / p, base / p]
        for c in candidates:
            if c.is_dir() or c.is_file():
                return c.resolve()
            tried.append(f"{label}: {c}")
        if label != "config data.dir":
            # An explicit choice that does not exist is an error, not a reason to fall back silently.
            break
    raise DataError(
        "Data not found (looked in: " + ("; ".join(tried) or "nothing was set") + "). "
        "Point to it with --data DIR or EVALUATOR_DATA=DIR, where DIR holds registry/apis.jsonl.gz and "
        "queries/G*_instruction.json (the layout of shared/toolbench), ToolBench's own archive "
        "(data/toolenv/tools and data/test_instruction), your own tools/ and queries.jsonl|csv "
        "(README: Your own tools), or a BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv); or pass "
        "--tools PATH --queries PATH."
    )
