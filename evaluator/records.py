"""Per-query records (`queries.jsonl`): the single source every metric and table is computed from.

The schema is in docs/DESIGN.md. Records are written sorted, with stable key order, so two runs that
computed the same thing write the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from .data import Query, Registry
from .retrieve import Retrieved


def _r(x: float) -> float:
    # Six decimals: far below any difference that matters, and stable across BLAS thread counts.
    return round(float(x), 6)


def base_record(q: Query, model: str | None, run: int) -> dict:
    return {
        "model": model,
        "run": run,
        "subset": q.subset,
        "query_id": q.query_id,
        "query": q.text,
        "gold": {g: list(ids) for g, ids in q.gold.items()},
    }


def retrieval_block(r: Retrieved, registry: Registry) -> dict:
    return {"retrieved": [registry.ids[i] for i in r.rows], "scores": [_r(s) for s in r.scores]}


def ptr_retrieval_block(r: Retrieved, registry: Registry) -> dict:
    block = retrieval_block(r, registry)
    block["stub_hits"] = [[registry.ids[i] for i in rows] for rows in r.stub_rows]
    block["stub_scores"] = [[_r(s) for s in sc] for sc in r.stub_scores]
    block["width"] = {str(k): w for k, w in sorted(r.width.items())}
    return block


def sort_key(rec: dict) -> tuple:
    return (rec["model"] or "", rec["run"], rec["subset"], rec["query_id"])


def write_records(path: Path, records: Iterable[dict]) -> int:
    recs = sorted(records, key=sort_key)
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for rec in recs:
            fh.write(json.dumps(rec, ensure_ascii=False, sort_keys=True) + "\n")
    tmp.replace(path)
    return len(recs)


def read_records(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
