"""Command line: `python -m evaluator [run flags]`, plus `cache`, `report`, `scaling`, `routing`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .config import ConfigError, Settings, load_settings, validate
from .data import DataError
from .embed import EmbedderError
from .llm.errors import ConfigError as LLMConfigError

COMMANDS = ("run", "cache", "report", "scaling", "routing")


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _ints(value: str) -> list[int]:
    try:
        return [int(v) for v in _csv(value)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {value!r}") from None


def run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m evaluator",
        description=(
            "Evaluate Retrieve-then-Plan (RtP) against Plan-then-Retrieve (PtR) tool discovery on the "
            "ToolBench registry. Other commands: `cache stats|clear`, `report OUT_DIR`, "
            "`scaling OUT_DIR`, `routing OUT_DIR` (each has --help)."
        ),
    )
    p.add_argument("--config", type=Path, help="settings file (default: configs/default.toml)")
    p.add_argument("--data", help="data folder (else $EVALUATOR_DATA, else the config's data.dir)")
    p.add_argument("--subsets", type=_csv, help="comma list of query-file stems or prefixes, e.g. G1,G2")
    p.add_argument("--k", type=int, help="retrieval budget handed to the planner (default 5)")
    p.add_argument("--ks", type=_ints, help="k-ablation budgets, e.g. 1,3,5,10,20")
    p.add_argument("--registry", choices=["full", "described"], help="every API, or only described ones")
    p.add_argument("--embedder", help="bundled:all-MiniLM-L6-v2 (default), a hub name, or a local folder")
    p.add_argument("--device", help="auto (default), cpu, cuda, cuda:1 ...")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], help="embedding precision")
    p.add_argument("--cache-dir", help="cache root for embeddings and LLM replies (default: cache/)")
    p.add_argument("--out", help="output folder (default: results/<timestamp>)")
    p.add_argument("--limit", type=int, help="first N queries per subset (0 = all)")
    p.add_argument("--retrieval-only", action="store_true", help="RtP retrieval metrics only; no LLM")
    p.add_argument("--model", action="append", dest="models", help="model profile (repeatable): sim, gemini, gpt-oss-120b, ...")
    p.add_argument("--runs", type=int, help="independent runs per model (default 4)")
    p.add_argument("--archs", type=_csv, help="comma list of rtp,ptr (default both)")
    p.add_argument("--base-url", help="override the model profile's endpoint (for sim: use a running simulator)")
    p.add_argument("--fallback-to-query", action="store_true", default=None, help="PtR: embed the raw query when no stub is produced")
    p.add_argument("--concurrency", type=int, help="override the profile's concurrent requests")
    p.add_argument("--rpm", type=float, help="override the profile's requests per minute")
    p.add_argument("--tpm", type=float, help="override the profile's tokens per minute")
    p.add_argument("--no-extras", action="store_true", help="skip the scaling and routing studies that follow a full run")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def settings_from(args: argparse.Namespace) -> Settings:
    s = load_settings(args.config)
    overrides = {
        "subsets": args.subsets,
        "k": args.k,
        "ks": args.ks,
        "registry": args.registry,
        "embedder": args.embedder,
        "device": args.device,
        "precision": args.precision,
        "cache_dir": args.cache_dir,
        "out": args.out,
        "limit": args.limit,
        "models": args.models,
        "runs": args.runs,
        "archs": args.archs,
        "fallback_to_query": args.fallback_to_query,
    }
    for name, value in overrides.items():
        if value is not None:
            setattr(s, name, value)
    if args.data:
        s.data_dir, s.data_from_cli = args.data, True
    validate(s)
    return s


def out_dir(s: Settings) -> Path:
    return Path(s.out) if s.out else Path("results") / time.strftime("%Y%m%d-%H%M%S")


def cmd_run(argv: list[str]) -> int:
    args = run_parser().parse_args(argv)
    s = settings_from(args)
    out = out_dir(s)
    progress = not args.no_progress
    if args.retrieval_only:
        from .pipeline import run_retrieval_only

        run_retrieval_only(s, out, progress=progress)
    else:
        from .pipeline import run_study

        run_study(s, out, args, progress=progress)
    print(f"\nResults in {out}/ (report.md, summary.json, queries.jsonl, figures/)")
    return 0


def cmd_report(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m evaluator report", description="Re-render report.md, summary.json and figures from a finished output folder; no LLM call.")
    p.add_argument("out_dir", type=Path)
    args = p.parse_args(argv)
    from .report import render

    _require_output(args.out_dir)
    render(args.out_dir)
    print(f"Re-rendered {args.out_dir}/report.md, summary.json and figures/")
    return 0


def cmd_cache(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m evaluator cache", description="Inspect or clear the LLM response cache.")
    p.add_argument("action", choices=["stats", "clear"])
    p.add_argument("--model", help="clear only this model profile's replies")
    p.add_argument("--cache-dir", help="cache root (default: the config's)")
    args = p.parse_args(argv)
    s = load_settings()
    root = s.resolve_path(args.cache_dir or s.cache_dir)
    from .llm.cache import cache_clear, cache_stats

    if args.action == "stats":
        for key, value in cache_stats(root).items():
            print(f"{key}: {value}")
    else:
        n = cache_clear(root, args.model)
        print(f"Removed {n} cached replies" + (f" of model {args.model}" if args.model else "") + f" from {root}")
    return 0


def cmd_experiment(name: str, argv: list[str]) -> int:
    from importlib import import_module

    return int(import_module(f".{name}", __package__).main(argv) or 0)


def _require_output(path: Path) -> None:
    if not (path / "queries.jsonl").is_file():
        raise DataError(f"{path}: not an evaluator output folder (no queries.jsonl). Pass the --out folder of a finished run.")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else "run"
    rest = argv[1:] if argv and argv[0] in COMMANDS else argv
    try:
        if command == "run":
            return cmd_run(rest)
        if command == "report":
            return cmd_report(rest)
        if command == "cache":
            return cmd_cache(rest)
        return cmd_experiment(command, rest)
    except (DataError, ConfigError, LLMConfigError, EmbedderError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: finished LLM calls are cached; rerun the same command to resume.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
