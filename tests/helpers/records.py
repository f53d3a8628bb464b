"""Synthetic `queries.jsonl` records and output directories for the metrics/stats/report tests.

Records follow the schema of docs/DESIGN.md. Randomness is seeded per (subset, query) for RtP (which
must be deterministic) and per (model, run, subset, query) for PtR and the planners.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

KMAX = 20
REGISTRY = [f"Tool {t}::api_{a}" for t in range(60) for a in range(5)]
SUBSETS = {"G1_instruction": 14, "G2_instruction": 10}


def plan(selected: Sequence[str], steps: int = 2, *, parse_error: str | None = None,
         llm_error: str | None = None) -> dict[str, Any]:
    return {"steps": [f"step {i}" for i in range(steps)], "selected": list(selected), "refused": not selected,
            "parse_error": parse_error, "llm_error": llm_error}


def record(model: str | None, run: int, subset: str, qid: int, *, api_list: Sequence[str], relevant: Sequence[str],
           rtp_retrieved: Sequence[str], rtp_plan: dict[str, Any] | None = None,
           ptr: dict[str, Any] | None = None) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "model": model, "run": run, "subset": subset, "query_id": qid, "query": f"query {qid}",
        "gold": {"api_list": list(api_list), "relevant": list(relevant)},
        "rtp": {"retrieved": list(rtp_retrieved), "scores": [0.9 - 0.01 * i for i in range(len(rtp_retrieved))],
                "plan": rtp_plan, "tokens": {"planner": {"prompt": 800, "completion": 60}} if rtp_plan else {}},
    }
    if ptr is not None:
        rec["ptr"] = ptr
    return rec


def ptr_block(stubs: Sequence[str], stub_hits: Sequence[Sequence[str]], retrieved: Sequence[str],
              plan_: dict[str, Any] | None, *, stub_scores: Sequence[Sequence[float]] | None = None,
              width: Mapping[str, int] | None = None, discovery_llm_error: str | None = None,
              discovery_parse_error: str | None = None, fallback: bool = False) -> dict[str, Any]:
    return {
        "stubs": [{"name": n, "reasoning": f"does {n}"} for n in stubs],
        "discovery_parse_error": discovery_parse_error, "discovery_llm_error": discovery_llm_error,
        "stub_hits": [list(h) for h in stub_hits],
        "stub_scores": [list(s) for s in stub_scores] if stub_scores is not None
        else [[0.8 - 0.01 * i for i in range(len(h))] for h in stub_hits],
        "retrieved": list(retrieved), "scores": [0.85 - 0.01 * i for i in range(len(retrieved))],
        "width": dict(width or {}), "fallback": fallback, "plan": plan_,
        "tokens": {"discovery": {"prompt": 150, "completion": 120}, "planner": {"prompt": 820, "completion": 70}},
    }


def _ranked(rng: random.Random, gold: Sequence[str], p_hit: float) -> list[str]:
    """A KMAX list where each gold API lands somewhere in it with probability p_hit."""
    others = [x for x in rng.sample(REGISTRY, KMAX * 2) if x not in gold][:KMAX]
    for g in gold:
        if rng.random() < p_hit:
            others.insert(rng.randrange(0, KMAX), g)
    return list(dict.fromkeys(others))[:KMAX]


def _planner(rng: random.Random, top: Sequence[str]) -> dict[str, Any]:
    u = rng.random()
    if u < 0.08:
        return plan([], 1)  # refusal
    if u < 0.11:
        return plan([], 0, parse_error="no JSON")
    if u < 0.13:
        return plan([], 0, llm_error="HTTP 500 after retries")
    chosen = rng.sample(list(top), min(len(top), rng.randint(1, 2)))
    if rng.random() < 0.1:
        chosen.append("Made Up/api")  # a selection outside the retrieved set
    return plan(chosen, rng.randint(1, 5))


def gold_for(subset: str, qid: int) -> tuple[list[str], list[str]]:
    rng = random.Random(f"gold|{subset}|{qid}")
    tool = rng.randrange(60)
    api_list = [f"Tool {tool}::api_{a}" for a in range(5)]
    return api_list, api_list[: rng.randint(1, 3)]


def study(models: Sequence[str] = ("sim",), runs: int = 4, subsets: Mapping[str, int] = SUBSETS,
          k: int = 5) -> list[dict[str, Any]]:
    recs = []
    for model in models:
        for run in range(runs):
            for subset, n in subsets.items():
                p_rtp, p_ptr = (0.5, 0.35) if subset.startswith("G1") else (0.25, 0.4)
                for qid in range(n):
                    api_list, relevant = gold_for(subset, qid)
                    rtp_ret = _ranked(random.Random(f"rtp|{subset}|{qid}"), api_list, p_rtp)
                    rng = random.Random(f"ptr|{model}|{run}|{subset}|{qid}")
                    n_stubs = rng.choice([0, 1, 2, 2, 3, 3])
                    names = [rng.choice(["search_news", "get_weather", f"fn_{qid}_{i}"]) for i in range(n_stubs)]
                    hits = [_ranked(rng, api_list, p_ptr) for _ in names]
                    ptr_ret = _ranked(rng, api_list, p_ptr) if names else []
                    width = {str(kk): len({x for h in hits for x in h[:kk]}) for kk in (1, 3, 5, 10, 20)}
                    disc_err = "timeout" if rng.random() < 0.03 else None
                    ptr = ptr_block(names, hits, ptr_ret, _planner(rng, ptr_ret[:k]), width=width,
                                    discovery_llm_error=disc_err)
                    rtp_plan = _planner(random.Random(f"rtpplan|{model}|{run}|{subset}|{qid}"), rtp_ret[:k])
                    recs.append(record(model, run, subset, qid, api_list=api_list, relevant=relevant,
                                       rtp_retrieved=rtp_ret, rtp_plan=rtp_plan, ptr=ptr))
    return recs


def retrieval_only(subsets: Mapping[str, int] = SUBSETS) -> list[dict[str, Any]]:
    recs = []
    for subset, n in subsets.items():
        for qid in range(n):
            api_list, relevant = gold_for(subset, qid)
            rtp_ret = _ranked(random.Random(f"rtp|{subset}|{qid}"), api_list, 0.5)
            recs.append(record(None, 0, subset, qid, api_list=api_list, relevant=relevant, rtp_retrieved=rtp_ret))
    return recs


def meta(models: Sequence[str] = ("sim",), runs: int = 4, *, simulated: bool = True,
         retrieval_only_: bool = False) -> dict[str, Any]:
    """Shaped like pipeline.study_meta: volatile parts under `runtime`, `llm_stats` and `settings.out`."""
    model_list = [] if retrieval_only_ else [{"name": m, "model": f"{m}-id", "simulated": simulated} for m in models]
    return {
        "version": "0.1.0", "settings": {"k": 5, "runs": runs, "out": "results/20260101-000000"},
        "models": model_list, "simulated": any(m["simulated"] for m in model_list),
        "runs": runs, "k": 5, "ks": [1, 3, 5, 10, 20], "embedder": "all-MiniLM-L6-v2",
        "registry": {"size": len(REGISTRY), "choice": "full", "source": "synthetic"}, "subsets": list(SUBSETS),
        "warnings": {"gold API missing from registry": {"count": 2, "examples": ["G1 query 7: Foo::bar"]}},
        "llm_stats": {m: {"requests": 10, "cache_hits": 3, "retries": 1, "http_429": 0} for m in models},
        "runtime": {"created": "2026-01-01T00:00:00", "timings": {"embed_s": 1.0}},
    }


def write_out(out_dir: Path, records: Sequence[Mapping[str, Any]], meta_: Mapping[str, Any],
              shuffle_seed: int | None = None) -> Path:
    """Write meta.json + queries.jsonl; `shuffle_seed` writes records in another order, as a concurrent run would."""
    out_dir.mkdir(parents=True, exist_ok=True)
    recs = list(records)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(recs)
    (out_dir / "meta.json").write_text(json.dumps(meta_, indent=1), encoding="utf-8")
    with (out_dir / "queries.jsonl").open("w", encoding="utf-8") as fh:
        for r in recs:
            fh.write(json.dumps(r) + "\n")
    return out_dir


def flat(rec: dict[str, Any]) -> dict[str, Any]:
    """A saved `queries.jsonl` line (format 4: blocks under `archs`) with each block at the top level, by its
    architecture's name, as the tests of RtP's and PtR's fields read them."""
    out = {k: v for k, v in rec.items() if k != "archs"}
    out.update(rec.get("archs") or {})
    return out


def same_rows(got: list[dict], want: list[dict]) -> bool:
    """Equal rows; stub cosines may differ by float noise (~1e-7): a stub's vector depends on which other
    stubs share its embedding batch (padding changes the kernels' summation order), and the online and batch
    paths batch stubs differently. Everything else must be exact."""
    def close(a: object, b: object) -> bool:
        if isinstance(a, float) and isinstance(b, float):
            return abs(a - b) <= 1e-6
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(map(close, a, b))
        return a == b

    return close(got, want)


EXTRA = {"hyde": 0.45, "fusion": 0.3}  # extra architectures and how often each gold API lands in their list


def with_extra_archs(recs: list[dict]) -> list[dict]:
    """Each record given a block per extra architecture (its own ranked list, a planner call)."""
    out = []
    for r in recs:
        r = dict(r)
        blocks = {}
        for name, p_hit in EXTRA.items():
            rng = random.Random(f"{name}|{r['model']}|{r['run']}|{r['subset']}|{r['query_id']}")
            ret = _ranked(rng, r["gold"]["api_list"], p_hit)
            blocks[name] = {"retrieved": ret, "scores": [0.9 - 0.01 * i for i in range(len(ret))],
                            "plan": _planner(rng, ret[:5]), "tokens": {"planner": {"prompt": 800, "completion": 50}}}
        r["archs"] = blocks
        out.append(r)
    return out
