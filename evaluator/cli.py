"""Command line: `python -m evaluator [run flags]`, plus `cache`, `report`, `scaling`, `routing`.

The only module that knows about argv, the terminal and exit codes. Every user mistake ends in one
line on stderr naming the flag, file or key and what to do — no traceback. Exit codes: 0 done;
1 the run stopped (bad key, exhausted quota: finished calls are cached); 2 a usage, config or data
error (before any work); 3 done, but some LLM calls failed for good (a rerun retries them);
130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from .config import ConfigError, ProfileOverrides, Settings, load_settings, validate
from .data import DataError
from .embed import EmbedderError
from .llm import FatalLLMError
from .schema import OutputDir, OutputError

EXIT_STOPPED, EXIT_USAGE, EXIT_FAILED_CALLS, EXIT_INTERRUPTED = 1, 2, 3, 130


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (argparse prints the whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {message} (see --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _ints(value: str) -> list[int]:
    try:
        return [int(v.replace("_", "")) for v in _csv(value)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {value!r}") from None


def run_parser() -> Parser:
    p = Parser(
        prog="python -m evaluator",
        description=(
            "Evaluate Retrieve-then-Plan (RtP) against Plan-then-Retrieve (PtR) tool discovery on the "
            "ToolBench registry. Other commands: `cache stats|clear`, `report OUT_DIR`, "
            "`scaling OUT_DIR`, `routing OUT_DIR` (each has --help)."
        ),
    )
    p.add_argument("--config", type=Path, help="settings file (default: configs/default.toml)")
    p.add_argument("--data", help="data folder (else $EVALUATOR_DATA, else the config's data.dir)")
    p.add_argument("--tools", help="registry file or folder: MCP tools/list results, OpenAI-style tool lists, JSONL or a ToolBench tree (default: the data folder's)")
    p.add_argument("--queries", nargs="+", metavar="PATH", help="query files or folders: JSONL/CSV with query and gold, or ToolBench test_instruction files (default: the data folder's)")
    p.add_argument("--tools-format", choices=["auto", "mcp", "openai", "jsonl", "toolbench"], help="force the registry format (default: detected from each file)")
    p.add_argument("--subsets", type=_csv, help="comma list of subsets (query-file stems, or a query file's subset column) or prefixes, e.g. G1,G2")
    p.add_argument("--k", type=int, help="retrieval budget handed to the planner (default 5)")
    p.add_argument("--ks", type=_ints, help="k-ablation budgets, e.g. 1,3,5,10,20")
    p.add_argument("--registry", choices=["full", "described"], help="every API, or only described ones")
    p.add_argument("--embedder", help="bundled:all-MiniLM-L6-v2 (default), a hub name, or a local folder")
    p.add_argument("--device", help="auto (default), cpu, cuda, cuda:1 ...")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16", "int8"], help="embedding precision")
    p.add_argument("--backend", choices=["auto", "torch", "onnx", "openvino"],
                   help="embedding runtime (auto: the fastest path verified equivalent to torch fp32)")
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
    p.add_argument("--max-tokens", type=int, help="override the profile's max_tokens (completion limit per call)")
    p.add_argument("--timeout", type=float, help="override the profile's timeout_s (seconds per request)")
    p.add_argument("--no-extras", action="store_true", help="skip the scaling and routing studies that follow a full run")
    p.add_argument("--batch", action="store_true", help="send the LLM calls through each profile's batch API (about half price; see README)")
    p.add_argument("--batch-cancel", action="store_true", help="cancel this cache's open batches of the --model profiles, keep their finished replies, and stop")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


# flag (argparse dest) -> Settings field
RUN_FLAGS = {
    "subsets": "subsets", "k": "k", "ks": "ks", "registry": "registry", "embedder": "embedder", "device": "device",
    "precision": "precision", "backend": "backend", "cache_dir": "cache_dir", "out": "out", "limit": "limit", "models": "models",
    "runs": "runs", "archs": "archs", "fallback_to_query": "fallback_to_query", "tools_format": "tools_format",
}


def settings_from(args: argparse.Namespace) -> Settings:
    s = load_settings(args.config)
    for dest, name in RUN_FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            setattr(s, name, value)
            s.cli_keys.add(name)
    if args.cache_dir:
        # a path typed on the command line is relative to where it is typed, existing or not
        s.cache_dir = str(Path(args.cache_dir).expanduser().absolute())
    if args.data:
        s.data_dir, s.data_from_cli = args.data, True
    # paths typed on the command line are relative to where they are typed
    if args.tools:
        s.tools = str(Path(args.tools).expanduser().absolute())
        s.cli_keys.add("tools")
    if args.queries:
        s.queries = [str(Path(q).expanduser().absolute()) for q in args.queries]
        s.cli_keys.add("queries")
    s.overrides = ProfileOverrides(base_url=args.base_url, concurrency=args.concurrency, rpm=args.rpm,
                                   tpm=args.tpm, max_tokens=args.max_tokens, timeout_s=args.timeout)
    s.extras = not args.no_extras
    s.batch = "cancel" if args.batch_cancel else ("submit" if args.batch else None)
    validate(s)
    return s


def cmd_run(argv: list[str]) -> int:
    from .app import run

    args = run_parser().parse_args(argv)
    s = settings_from(args)
    outcome = run(s, progress=not args.no_progress, retrieval_only=args.retrieval_only)
    if outcome.message:  # --batch-cancel: no study ran
        print(outcome.message)
        return 0
    print(f"\nResults in {outcome.out}/ (report.md, summary.json, queries.jsonl, figures/)")
    if outcome.failed:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(outcome.failed.items()))
        print(f"error: {sum(outcome.failed.values())} LLM calls failed for good ({kinds}); they are excluded from "
              "the results. Rerun the same command to retry them (every other reply comes from the cache).",
              file=sys.stderr)
        return EXIT_FAILED_CALLS
    return 0


def cmd_report(argv: list[str]) -> int:
    from .app import render_outputs

    p = Parser(prog="python -m evaluator report",
               description="Re-render report.md, summary.json and figures from a finished output folder; no LLM call.")
    p.add_argument("out_dir", type=Path)
    args = p.parse_args(argv)
    render_outputs(OutputDir(args.out_dir).require())
    print(f"Re-rendered {args.out_dir}/report.md, summary.json and figures/")
    return 0


def cmd_cache(argv: list[str]) -> int:
    p = Parser(prog="python -m evaluator cache", description="Inspect or clear the LLM response cache.")
    p.add_argument("action", choices=["stats", "clear"])
    p.add_argument("--model", help="clear only this model profile's replies")
    p.add_argument("--cache-dir", help="cache root (default: the config's)")
    args = p.parse_args(argv)
    s = load_settings()
    root = s.resolve_path(args.cache_dir or s.cache_dir)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--cache-dir {root} is a file, not a folder; pass the cache folder.")
    from .llm.cache import cache_clear, cache_stats

    if args.action == "stats":
        for key, value in cache_stats(root).items():
            print(f"{key}: {value}")
    else:
        n = cache_clear(root, args.model)
        print(f"Removed {n} cached replies" + (f" of model {args.model}" if args.model else "") + f" from {root}")
    return 0


def _analysis_settings(args: argparse.Namespace, od: OutputDir) -> Settings:
    """The config's analysis settings with this command's flags, and the run's k."""
    s = load_settings(args.config)
    meta = od.read_meta()
    s.k = args.k or meta.k
    for dest in ("scaling_sizes", "scaling_seeds", "scaling_subsets", "divergence_subset", "routing_train",
                 "routing_test", "routing_folds", "routing_seed"):
        value = getattr(args, dest, None)
        if value is not None:
            setattr(s, dest, value)
    # `routing` has no --cache-dir flag (it embeds nothing)
    if cache_dir := getattr(args, "cache_dir", None) or meta.settings.get("cache_dir"):
        s.cache_dir = cache_dir
    validate(s)
    return s


def _analysis_command(prog: str, description: str, argv: list[str], add: Callable[[Parser], None],
                      run: Callable[[argparse.Namespace, OutputDir, Settings], dict]) -> int:
    """`scaling` and `routing`: a finished output folder, the config's [analysis] section, this command's flags."""
    p = Parser(prog=f"python -m evaluator {prog}", description=description)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--config", type=Path, help="settings file whose [analysis] section applies (default: configs/default.toml)")
    p.add_argument("--k", type=int, help="retrieval budget (default: the run's k)")
    add(p)
    args = p.parse_args(argv)
    od = OutputDir(args.out_dir).require()
    meta = run(args, od, _analysis_settings(args, od))
    print(f"{prog.capitalize()} study in {meta['timing_s']:.1f}s: {args.out_dir}/{prog}.json; updated report.md "
          f"and figures/{prog}.png")
    return 0


def cmd_scaling(argv: list[str]) -> int:
    from .app import scaling_from_output

    def add(p: Parser) -> None:
        p.add_argument("--sizes", dest="scaling_sizes", metavar="N,N,...", type=_ints, help="sub-registry sizes (default from the config); the full registry is always added")
        p.add_argument("--seeds", dest="scaling_seeds", metavar="N", type=int, help="distractor draws per size (default 5)")
        p.add_argument("--subsets", dest="scaling_subsets", metavar="S,S,...", type=_csv, help="comma list of subsets or prefixes (default: every subset but the last in sorted order)")
        p.add_argument("--divergence-subset", help="subset whose top-k divergence is reported (default: the first scaling subset)")
        p.add_argument("--data", help="data folder (default: the run's, from meta.json)")
        p.add_argument("--cache-dir", help="embedding cache root (default: the run's)")
        p.add_argument("--device", default="auto", help="device for cache misses (default auto)")
        p.add_argument("--no-progress", action="store_true")

    return _analysis_command(
        "scaling", "Scaling study (paper Table 10): RtP and PtR recall on sub-registries of growing size, from a "
        "finished output folder; no LLM call, embeddings from the run's cache.", argv, add,
        lambda args, od, s: scaling_from_output(od, s, data_dir=args.data, device=args.device,
                                                progress=not args.no_progress).meta)


def cmd_routing(argv: list[str]) -> int:
    from .app import routing_from_output

    def add(p: Parser) -> None:
        p.add_argument("--train", dest="routing_train", metavar="S,S,...", type=_csv, help="subsets tau is tuned on for the split evaluation (default: every subset but the last in sorted order)")
        p.add_argument("--test", dest="routing_test", metavar="S,S,...", type=_csv, help="subsets it is reported on (default: the last subset in sorted order)")
        p.add_argument("--folds", dest="routing_folds", metavar="N", type=int, help="cross-validation folds (default 5)")
        p.add_argument("--seed", dest="routing_seed", metavar="N", type=int, help="seed of the fold assignment (default 0)")

    return _analysis_command(
        "routing", "Complexity-adaptive routing (RtP when RtP's top-1 score >= tau, else PtR; also query length "
        "and clause count) from a finished output folder; no embedding, no LLM call.", argv, add,
        lambda _args, od, s: routing_from_output(od, s).meta)


HANDLERS: dict[str, Callable[[list[str]], int]] = {
    "run": cmd_run, "report": cmd_report, "cache": cmd_cache, "scaling": cmd_scaling, "routing": cmd_routing,
    "requests": lambda argv: __import__("evaluator.requests_cli", fromlist=["dispatch"]).dispatch(argv),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in HANDLERS else "run"
    rest = argv[1:] if argv and argv[0] in HANDLERS else argv
    try:
        return HANDLERS[command](rest)
    except SystemExit as e:  # argparse: --help (0) or a usage error already printed (2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    except (DataError, ConfigError, EmbedderError, OutputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except FatalLLMError as e:
        print(f"error: {e} Every call finished before the stop is cached: rerun the same command to resume.",
              file=sys.stderr)
        return EXIT_STOPPED
    except KeyboardInterrupt:
        print("\ninterrupted: finished LLM calls are cached; rerun the same command to resume.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:
        # A file system failure nothing checked for (disk full, a folder removed mid-run): one line, not a
        # traceback. Finished LLM calls are in the cache, so a rerun pays for nothing twice.
        where = f" {e.filename}" if e.filename else ""
        print(f"error: cannot read or write{where}: {e.strerror or e}. Fix the path or free space and rerun.",
              file=sys.stderr)
        return EXIT_STOPPED
