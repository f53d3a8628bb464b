"""`python bench/real_server.py --base-url URL --model ID`: the study against a real OpenAI-compatible server.

Runs a small study (`--data examples/mcp --subsets single --limit 5 --runs 2` by default) through the
CLI twice per mode, with structured outputs (`"json_schema"`, the `local` profile's default;
`"json_object_schema"`, the form llama-cpp-python takes) and without (`"none"`), each first from an
empty LLM cache for that mode and then again from it, and writes `bench/results/real_server.json`: server, model, calls, wall time, parse rates per prompt, truncated
replies, and the rerun's request count (which must be 0). Not part of `python -m bench`: it needs a
server (see the README's "Local and self-hosted models" and bench/README.md's "Real server").
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, Stamp, stamped  # noqa: E402
from evaluator.results.schema import TRUNCATED, OutputDir, Record, record_key  # noqa: E402

RESULT = REPO / "bench" / "results" / "real_server.json"
MEASURES = ("evaluator", "bench/real_server.py")  # the code it measures (`python -m bench --check`)
MODES = ("json_schema", "json_object_schema", "none")


def _profile(work: Path, mode: str, base_url: str, model: str) -> Path:
    """A copy of the shipped `local` profile with this mode's `structured` setting."""
    text = (REPO / "configs" / "models" / "local.toml").read_text(encoding="utf-8")
    text = re.sub(r'(?m)^structured = ".*"$', f'structured = "{mode}"', text)
    text = re.sub(r'(?m)^model = ".*"$', f'model = "{model}"', text)
    text = re.sub(r'(?m)^base_url = ".*"$', f'base_url = "{base_url}"', text)
    text = re.sub(r"(?m)^(model_env|base_url_env) = .*$", "", text)
    path = work / f"local-{mode}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _run(cmd: list[str], log: Path) -> float:
    start = time.monotonic()
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        sys.exit(f"study failed (exit {rc}); see {log}")
    return time.monotonic() - start


def _read(out: Path) -> tuple[dict[str, Any], list[Record]]:
    """This run's per-model LLM stats and its typed records, through the output folder's one reader."""
    od = OutputDir(out).require()
    stats = od.read_meta().llm_stats
    return (next(iter(stats.values())) if stats else {}), od.read_records()


def _rate(num: int, den: int) -> float | None:
    return round(num / den, 3) if den else None


def parse_rates(recs: list[Record]) -> dict[str, Any]:
    """Per prompt: replies received, parsed, holding an answer, cut at max_tokens; stub-copy flags."""
    disc = [r.ptr for r in recs if r.ptr is not None and not r.ptr.discovery_llm_error]
    disc_ok = [p for p in disc if not p.discovery_parse_error]
    stubs = [s for p in disc for s in p.stubs]
    out: dict[str, Any] = {
        "discovery": {
            "replies": len(disc),
            "parsed": len(disc_ok),
            "parse_rate": _rate(len(disc_ok), len(disc)),
            "with_stubs": sum(bool(p.stubs) for p in disc),
            "stubs": len(stubs),
            "example_copies": sum(s.example_copy for s in stubs),
            "truncated": sum(p.discovery_finish_reason == TRUNCATED for p in disc),
        }
    }
    for arch in ("rtp", "ptr"):
        plans = [b.plan for r in recs if (b := r.block(arch)) is not None and b.plan is not None]
        # A reply was received (a PtR query with no stub has a plan block but no planner call).
        plans = [p for p in plans if p.usable and (p.finish_reason or p.steps or p.parse_error)]
        ok = [p for p in plans if not p.parse_error]
        out[f"planner_{arch}"] = {
            "replies": len(plans),
            "parsed": len(ok),
            "parse_rate": _rate(len(ok), len(plans)),
            "selected_offered": sum(bool(p.counted_selected) for p in plans),
            "selected_unoffered_only": sum(bool(p.unique_selected) and not p.counted_selected for p in plans),
            "truncated": sum(p.truncated for p in plans),
        }
    return out


def _server_info(base_url: str) -> Any:
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=10) as r:  # noqa: S310 (the user's own server)
            return json.loads(r.read())
    except (OSError, ValueError) as e:
        return f"unavailable: {e}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", required=True, help="the server's OpenAI-compatible base URL, ending in /v1")
    ap.add_argument("--model", required=True, help="the model id the server expects")
    ap.add_argument("--server", default="", help="what the server is, for the record (e.g. 'llama-cpp-python 0.3.x, 1 thread')")
    ap.add_argument("--work", type=Path, default=Path("/tmp/real_server"), help="scratch folder (caches, outputs)")
    ap.add_argument("--embed-cache", type=Path, help="a cache root whose embeddings/ to copy first (spares the registry)")
    ap.add_argument("--modes", default=",".join(MODES), help="structured modes to run, comma-separated")
    ap.add_argument("--study-args", default="--data examples/mcp --subsets single --limit 5 --runs 2",
                    help="the study's CLI flags (default: the bundled MCP registry, 38 tools; ToolBench's 47k "
                    "APIs take ~10 min to embed on 2 cores the first time)")
    ap.add_argument("--extra", default="", help="further CLI flags, e.g. '--max-tokens 256 --timeout 300'")
    args = ap.parse_args(argv)
    stamp = Stamp()

    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "cache"
    if args.embed_cache and not (cache / "embeddings").exists():
        shutil.copytree(args.embed_cache / "embeddings", cache / "embeddings")
    base = [sys.executable, "-m", "evaluator", *shlex.split(args.study_args), "--no-extras", "--no-progress",
            "--cache-dir", str(cache), *shlex.split(args.extra)]
    study = args.study_args
    results: dict[str, Any] = {}
    for mode in [m for m in args.modes.split(",") if m]:
        profile = _profile(work, mode, args.base_url, args.model)
        runs = {}
        for label in ("first", "rerun"):
            out = work / f"out-{mode}-{label}"
            shutil.rmtree(out, ignore_errors=True)
            wall = _run([*base, "--model", str(profile), "--out", str(out)], work / f"{mode}-{label}.log")
            stats, recs = _read(out)
            runs[label] = {"wall_s": round(wall, 1), "stats": stats, "records": recs}
        first, rerun = runs["first"], runs["rerun"]
        st = first["stats"]
        # A run with extra flags (e.g. a small --max-tokens to provoke cuts) is its own entry.
        results[f"{mode} {args.extra}".strip()] = {
            "structured": mode,
            "extra_flags": args.extra,
            "wall_s": first["wall_s"],
            "calls": st.get("calls"),
            "requests": st.get("requests"),
            "retries": st.get("retries"),
            "timeouts": st.get("timeouts"),
            "errors": st.get("errors"),
            "truncated_replies": st.get("truncated"),
            "completion_tokens": st.get("completion_tokens"),
            "prompt_tokens": st.get("prompt_tokens"),
            "latency_s": st.get("latency_s"),
            "queue_s": st.get("queue_s"),
            "max_in_flight": st.get("max_in_flight"),
            "dropped_params": st.get("dropped_params"),
            "parse": parse_rates(first["records"]),
            "rerun": {
                "wall_s": rerun["wall_s"],
                "requests": rerun["stats"].get("requests"),
                "cache_hits": rerun["stats"].get("cache_hits"),
                "identical_records": sorted(first["records"], key=record_key) == sorted(rerun["records"], key=record_key),
            },
        }
        print(json.dumps({mode: results[f"{mode} {args.extra}".strip()]["parse"]}, indent=1), flush=True)

    # Modes measured in an earlier invocation against the same server and model are kept.
    if RESULT.exists():
        old = json.loads(RESULT.read_text())
        if (old.get("base_url"), old.get("model"), old.get("study")) == (args.base_url, args.model, study):
            results = {**old.get("modes", {}), **results}
    payload = {
        "name": "real_server",
        "server": args.server,
        "base_url": args.base_url,
        "model": args.model,
        "models_endpoint": _server_info(args.base_url),
        "study": study,
        "profile": "configs/models/local.toml (structured set per mode)",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "modes": results,
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(stamped(payload, stamp), indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
