"""Pipeline stage: runs the study and writes `meta.json` and `queries.jsonl`, then the report."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from . import __version__
from .records import base_record, retrieval_block, write_records
from .study import Study, prepare


def study_meta(study: Study, models: list[dict] | None = None) -> dict:
    s = study.settings
    settings = asdict(s)
    settings.pop("data_from_cli", None)
    return {
        "version": __version__,
        "settings": settings,
        "data_dir": str(study.data_dir),
        "embedder": study.embedder.cache_name,
        "precision": study.embedder.precision,
        "registry": {"choice": s.registry, "size": len(study.registry), "source": study.registry.source},
        "subsets": study.subsets,
        "k": s.k,
        "ks": sorted(set(s.ks)),
        "runs": s.runs if models else 1,
        "models": models or [],
        "simulated": any(m.get("simulated") for m in models or []),
        "retrieval_only": not models,
        "warnings": study.warnings.as_dict(),
        # Everything that changes from one invocation to the next lives here and stays out of summary.json.
        "runtime": {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "timings": study.timings, "embed": asdict(study.embedder.stats)},
    }


def write_meta(out: Path, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True, default=str), encoding="utf-8")
    tmp.replace(out / "meta.json")


def run_retrieval_only(s, out: Path, progress: bool = True) -> Study:
    study = prepare(s, progress)
    records = []
    for q, r in zip(study.queries, study.rtp, strict=True):
        rec = base_record(q, None, 0)
        rec["rtp"] = retrieval_block(r, study.registry) | {"plan": None, "tokens": {}}
        records.append(rec)
    write_meta(out, study_meta(study))
    write_records(out / "queries.jsonl", records)
    _render(out)
    return study


def _render(out: Path) -> None:
    from .report import render

    render(out)
