"""Command line: `python -m evaluator [run flags]`, plus `cache`, `report`, `scaling`, `routing`, `requests`.

The only module that knows about argv, the terminal and exit codes. Every user mistake ends in one
line on stderr naming the flag, file or key and what to do — no traceback. Exit codes (`core.errors`,
where every error class says its own and its line): 0 done; 1 the command stopped (bad key, exhausted quota:
finished calls are cached); 2 a usage, config or data error (before any work); 3 done, but some LLM calls
failed for good (a rerun retries them); 4 stopped at --budget (replies received are cached: a rerun with a
larger budget resumes); 5 done, but an architecture failed on some queries (one line per architecture and kind
of failure; those blocks are left out of the results); 130 interrupted (Ctrl-C, SIGTERM or SIGHUP: calls
already on the wire get a few seconds to arrive and be cached).

Progress bars, notes and warnings of the stages reach stderr through the one `Reporter` made here
(`make_reporter`); the engine's `logging` warnings through the handler `main` installs.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import sqlite3
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TextIO

from evaluator.analysis.routing_study import RoutingMeta
from evaluator.analysis.scaling_study import ScalingMeta
from evaluator.app import arch_check, models, outputs, request_commands, run_study, viewer
from evaluator.batch.ray_engine import RayOptions
from evaluator.batch.request_files import import_files
from evaluator.cli import view_server
from evaluator.core.aio import interrupt_on_stop_signals, stop_signal
from evaluator.core.errors import (
    EXIT_FAILED_BLOCKS,
    EXIT_FAILED_CALLS,
    EXIT_INTERRUPTED,
    EXIT_STOPPED,
    EXIT_USAGE,
    ConfigError,
    EvaluatorError,
)
from evaluator.core.paths import resolve_path
from evaluator.core.progress import Reporter
from evaluator.core.redact import RedactFilter, redact, redacted_traceback
from evaluator.data import REGISTRY_CHOICES
from evaluator.llm import cache_clear, cache_stats, new_invocation
from evaluator.llm.profiles import STRUCTURED
from evaluator.render.view_page import trace_text
from evaluator.results.schema import OutputDir
from evaluator.settings.invocation import BATCH_FALLBACKS, STOP_GRACE_S, Invocation, ProfileOverrides
from evaluator.settings.load import load, load_settings
from evaluator.settings.sections import (
    BACKEND_CHOICES,
    PRECISION_CHOICES,
    RETRIEVER_CHOICES,
    TOOLS_FORMAT_CHOICES,
    Settings,
)
from evaluator.study.archs import BUILTIN

DEFAULTS = Settings()  # every setting's default, as the help states it (settings.sections holds them)


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (argparse prints the whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {message} (see --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def make_reporter(progress: bool = True) -> Reporter:
    """The stages' progress bars, notes and warnings, on stderr (stdout keeps the results' lines)."""
    return Reporter(sys.stderr, progress=progress)


def _budget(value: str) -> float:
    try:
        usd = float(value)
    except ValueError:
        usd = float("nan")
    if not 0 <= usd < float("inf"):
        raise argparse.ArgumentTypeError(f"expected the most this run may spend, in USD (0 or more), e.g. 5; got {value!r}")
    return usd


def _bounded(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer from `lo` to `hi` (a count of the command's own, not a setting)."""

    def parse(value: str) -> int:
        try:
            n = int(value.replace("_", ""))
        except ValueError:
            n = lo - 1
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer from {lo:,} to {hi:,}, got {value!r}")
        return n

    return parse


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _ints(value: str) -> list[int]:
    try:
        return [int(v.replace("_", "")) for v in _csv(value)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {value!r}") from None


def _rate_flags(p: argparse.ArgumentParser) -> None:
    """The profile's pace, overridden (the study and `requests run` take the same flags)."""
    p.add_argument("--concurrency", type=int, help="override the profile's concurrent requests ([pacing] concurrency)")
    p.add_argument("--rpm", type=float, help="override the profile's requests per minute ([pacing] rpm)")
    p.add_argument("--tpm", type=float, help="override the profile's tokens per minute ([pacing] tpm)")


def run_parser() -> Parser:
    p = Parser(
        prog="python -m evaluator",
        description=(
            "Evaluate Retrieve-then-Plan (RtP) against Plan-then-Retrieve (PtR) tool discovery on the "
            "ToolBench registry. Other commands: `cache stats|clear`, `report OUT_DIR`, "
            "`scaling OUT_DIR`, `routing OUT_DIR`, `models` (each has --help)."
        ),
    )
    p.add_argument("--config", type=Path, help="settings file (default: configs/default.toml)")
    p.add_argument("--data", help="data folder, or a BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) (else $EVALUATOR_DATA, else the config's data.dir)")
    p.add_argument("--tools", help="registry file or folder: MCP tools/list results, OpenAI-style tool lists, JSONL, a ToolBench tree or a BEIR folder's corpus (default: the data folder's)")
    p.add_argument("--queries", nargs="+", metavar="PATH", help="query files or folders: JSONL/CSV with query and gold, ToolBench test_instruction files, or a BEIR folder (its queries judged by --split) (default: the data folder's)")
    p.add_argument("--tools-format", choices=TOOLS_FORMAT_CHOICES, help="force the registry format (default: detected from each file)")
    p.add_argument("--split", help=f"a BEIR folder (corpus.jsonl, queries.jsonl, qrels/): the qrels/<split>.tsv whose judged queries run (default {DEFAULTS.data.split})")
    p.add_argument("--subset-field", metavar="FIELD", help="a BEIR folder: the query field holding each query's subset, dotted (e.g. metadata.subset; default: one subset named after the folder)")
    p.add_argument("--subsets", type=_csv, help="comma list of subsets (query-file stems, or a query file's subset column) or prefixes, e.g. G1,G2")
    p.add_argument("--k", type=int, help=f"retrieval budget handed to the planner (default {DEFAULTS.retrieval.k})")
    p.add_argument("--ks", type=_ints, help=f"k-ablation budgets (default {','.join(map(str, DEFAULTS.retrieval.ks))})")
    p.add_argument("--registry", choices=REGISTRY_CHOICES, help="every API, or only described ones")
    p.add_argument("--embedder", help=f"{DEFAULTS.embed.model} (default), bundled:all-mpnet-base-v2 (optional extra), a hub name, or a local folder")
    p.add_argument("--device", help=f"{DEFAULTS.embed.device} (default), cpu, cuda, cuda:1 ...")
    p.add_argument("--precision", choices=PRECISION_CHOICES, help="embedding precision")
    p.add_argument("--backend", choices=BACKEND_CHOICES,
                   help="embedding runtime (auto: the fastest path verified equivalent to torch fp32)")
    p.add_argument("--cache-dir", help=f"cache root for embeddings and LLM replies (default: {DEFAULTS.run.cache_dir}/)")
    p.add_argument("--out", help="output folder (default: results/<timestamp>); rerunning the same study into it "
                   "resumes it, another study's results there need --overwrite")
    p.add_argument("--overwrite", action="store_true", help="--out holds another study's results: replace them "
                   "(removed once this study's are written; never merged)")
    p.add_argument("--limit", type=int, help="first N queries per subset (0 = all)")
    p.add_argument("--retrieval-only", action="store_true", help="RtP retrieval metrics only; no LLM")
    p.add_argument("--model", action="append", dest="models", help="model (repeatable): a profile (sim, gemini, "
                   "gpt-oss-120b, a .toml path) or PROVIDER/MODEL (anthropic/claude-sonnet-4-5, openai/gpt-5-mini, "
                   "google/gemini-2.5-flash, vllm/NAME, ollama/NAME, ...: `models` lists them)")
    p.add_argument("--runs", type=int, help=f"independent runs per model (default {DEFAULTS.run.runs})")
    p.add_argument("--archs", type=_csv, help=f"comma list of architectures: {', '.join(BUILTIN)} (default "
                   f"{','.join(DEFAULTS.run.archs)}), or a plugin path/to/file.py:ClassName or package.module:ClassName")
    p.add_argument("--route-tau", type=float, metavar="TAU", help="route: RtP when RtP's top-1 score >= TAU, else PtR "
                   "(default: the median of the study's top-1 scores)")
    p.add_argument("--arch-timeout", type=float, metavar="S", help="an architecture's own time on one query, model calls "
                   f"and searches not counted; past it that block fails as a timeout (default {DEFAULTS.run.arch_timeout_s:g})")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first query an architecture fails on (it "
                   "raised, broke the plugin contract, timed out, waited in a cycle), with its error; without it such "
                   "blocks are left out of the results, counted, and the study goes on (exit 5)")
    p.add_argument("--base-url", help="override the model's endpoint (for sim: use a running simulator; vllm, sglang, "
                   "llamacpp: their server's /v1 address)")
    p.add_argument("--retriever", choices=RETRIEVER_CHOICES,
                   help=f"what every architecture searches with (default {DEFAULTS.retrieval.retriever}): dense, bm25, hybrid "
                   "(RRF of both)")
    p.add_argument("--fallback-to-query", action="store_true", default=None, help="PtR: embed the raw query when no stub is produced")
    _rate_flags(p)
    p.add_argument("--max-tokens", type=int, help="override the profile's [sampling] max_tokens (completion limit per call)")
    p.add_argument("--timeout", type=float, dest="timeout_s",
                   help="override the profile's [connection] timeout_s (seconds per request)")
    p.add_argument("--structured", choices=STRUCTURED, help="override the profile's [sampling] `structured`: how each prompt's JSON "
                   "schema is sent (json_schema: OpenAI's response_format; the simulator then answers any prompt "
                   "with a schema, a plugin's own too, with JSON valid against it)")
    p.add_argument("--no-extras", action="store_true", help="skip the scaling and routing studies that follow a full run")
    p.add_argument("--batch", action="store_true", help="send the LLM calls through each profile's batch API (about half price; see README)")
    p.add_argument("--batch-fallback", choices=BATCH_FALLBACKS,
                   help="--batch: what happens to requests the batch API did not answer (refused, failed, expired): "
                        "stop the study before any online call (default) or send them online at the online price")
    p.add_argument("--batch-cancel", action="store_true", help="cancel this cache's open batches of the --model profiles, keep their finished replies, and stop")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--dry-run", action="store_true", help="prepare what costs nothing (data, embeddings, retrieval, cache lookups), then print and write OUT/plan.json: calls, tokens, USD and time per model; send nothing")
    p.add_argument("--budget", type=_budget, metavar="USD", help="stop sending before this invocation could spend more than USD (online prices; replies received stay cached; exit code 4)")
    p.add_argument("--stop-grace", type=float, metavar="S", help=f"seconds the LLM calls on the wire at a stop (SIGTERM, SIGHUP, Ctrl-C) get to arrive and be cached (default {STOP_GRACE_S:g})")
    p.add_argument("--rate-dir", help="share each model's RPM/TPM pacing with every process using this folder (default: the cache folder)")
    return p


# flag (argparse dest) -> setting, by section and key
RUN_FLAGS = {
    "subsets": "data.subsets", "limit": "data.limit", "registry": "data.registry", "tools_format": "data.tools_format",
    "split": "data.split", "subset_field": "data.subset_field",
    "embedder": "embed.model", "device": "embed.device", "precision": "embed.precision", "backend": "embed.backend",
    "k": "retrieval.k", "ks": "retrieval.ks", "fallback_to_query": "retrieval.fallback_to_query",
    "retriever": "retrieval.retriever",
    "models": "run.models", "runs": "run.runs", "archs": "run.archs", "out": "run.out", "route_tau": "run.route_tau",
    "arch_timeout": "run.arch_timeout_s",
}
# flag (argparse dest) -> option of the invocation (`settings.invocation.Invocation`, not saved)
OPTION_FLAGS = {"batch_fallback": "batch_fallback", "stop_grace": "stop_grace_s", "budget": "budget_usd"}


def _absolute(path: str) -> str:
    """A path typed on the command line is relative to where it is typed, existing or not."""
    return str(Path(path).expanduser().absolute())


def _setting_flags(args: argparse.Namespace) -> dict[str, object]:
    """The settings typed as flags (those of `RUN_FLAGS` the parser has, and the paths), by dotted name."""
    flags: dict[str, object] = {name: value for dest, name in RUN_FLAGS.items()
                                if (value := getattr(args, dest, None)) is not None}
    if args.cache_dir:
        flags["run.cache_dir"] = _absolute(args.cache_dir)
    if args.data:
        flags["data.dir"] = args.data
    if args.tools:
        flags["data.tools"] = _absolute(args.tools)
    if args.queries:
        flags["data.queries"] = [_absolute(q) for q in args.queries]
    return flags


def settings_from(args: argparse.Namespace) -> tuple[Settings, Invocation]:
    flags = _setting_flags(args)
    options = {name: value for dest, name in OPTION_FLAGS.items() if (value := getattr(args, dest, None)) is not None}
    if args.rate_dir:
        options["rate_dir"] = _absolute(args.rate_dir)
    options |= {
        "overrides": ProfileOverrides.given_in(vars(args)),
        "extras": not args.no_extras, "dry_run": args.dry_run, "data_from_cli": bool(args.data),
        "overwrite": args.overwrite,
        "fail_fast": args.fail_fast,
        "batch": "cancel" if args.batch_cancel else ("submit" if args.batch else None)}
    return load(args.config, flags, options)


# The folders the running command writes: a file-system error that names no file (a write to an open file, a
# database on a full disk) is reported with these, so the line always says where to free space.
_WRITES: list[str] = []


def _writing(*paths: object) -> None:
    _WRITES[:] = [str(p) for p in dict.fromkeys(paths) if p]


def cmd_run(argv: list[str]) -> int:
    args = run_parser().parse_args(argv)
    s, inv = settings_from(args)
    _writing(s.run.out or "results/", resolve_path(s.run.cache_dir))
    outcome = run_study.run(s, inv, reporter=make_reporter(not args.no_progress), retrieval_only=args.retrieval_only)
    if outcome.message:  # --batch-cancel: no study ran
        print(outcome.message)
        return 0
    print(f"\nResults in {outcome.out}/ (report.md, summary.json, queries.jsonl, figures/)")
    if outcome.cut:
        kinds = ", ".join(f"{n} {cause}" for cause, n in sorted(outcome.cut.items()))
        print(f"warning: {sum(outcome.cut.values())} replies in the results were cut short ({kinds}; max_tokens: the "
              "profile's limit, context: the server's context size, content_filter: the provider's filter); they "
              "are scored as they came and counted in report.md", file=sys.stderr)
    if outcome.usage_estimated:
        print(f"warning: {outcome.usage_estimated} replies carried no token usage; their tokens and cost are "
              "estimates (characters / chars_per_token), counted as usage_estimated in meta.json", file=sys.stderr)
    for blocks in outcome.failed_blocks:  # one line per architecture and kind of failure
        print(redact(blocks.line()), file=sys.stderr)
    if outcome.failed_blocks:
        n = sum(b.count for b in outcome.failed_blocks)
        print(f"error: {n} (query, run) blocks failed: they are left out of every metric and test (report.md, "
              "Errors) and got no planner call; the other results are whole. Fix the architecture (`python -m "
              "evaluator arch check FILE.py:Class` tries it in seconds) and rerun: cached replies are not paid again.",
              file=sys.stderr)
    if outcome.failed:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(outcome.failed.items()))
        print(f"error: {sum(outcome.failed.values())} LLM calls failed for good ({kinds}); they are excluded from "
              "the results. Rerun the same command to retry them (every other reply comes from the cache).",
              file=sys.stderr)
    if outcome.failed_blocks:
        return EXIT_FAILED_BLOCKS
    return EXIT_FAILED_CALLS if outcome.failed else 0


def report_parser() -> Parser:
    p = Parser(prog="python -m evaluator report",
               description="Re-render report.md, summary.json and figures from a finished output folder; no LLM call.")
    p.add_argument("out_dir", type=Path)
    return p


def cmd_report(argv: list[str]) -> int:
    p = report_parser()
    args = p.parse_args(argv)
    _writing(args.out_dir)
    od = OutputDir(args.out_dir).require()
    with od.writing("`report`", make_reporter(False).info):  # one writer per output folder
        outputs.render_outputs(od)
    print(f"Re-rendered {args.out_dir}/report.md, summary.json and figures/")
    return 0


def cache_parser() -> Parser:
    p = Parser(prog="python -m evaluator cache", description="Inspect or clear the LLM response cache.")
    p.add_argument("action", choices=["stats", "clear"])
    p.add_argument("--model", help="clear only this model profile's replies")
    p.add_argument("--cache-dir", help="cache root (default: the config's)")
    return p


def cmd_cache(argv: list[str]) -> int:
    p = cache_parser()
    args = p.parse_args(argv)
    s = load_settings()
    root = resolve_path(args.cache_dir or s.run.cache_dir)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--cache-dir {root} is a file, not a folder; pass the cache folder.")
    if args.action == "stats":
        for key, value in cache_stats(root).items():
            print(f"{key}: {value}")
    else:
        n = cache_clear(root, args.model)
        print(f"Removed {n} cached replies" + (f" of model {args.model}" if args.model else "") + f" from {root}")
    return 0


def _analysis_settings(args: argparse.Namespace, od: OutputDir) -> Settings:
    """The config's analysis settings with this command's flags, and the run's k."""
    meta = od.read_meta()
    flags = {"retrieval.k": args.k or meta.k}
    for dest in ("scaling_sizes", "scaling_seeds", "scaling_subsets", "divergence_subset", "routing_train",
                 "routing_test", "routing_folds", "routing_seed"):
        value = getattr(args, dest, None)
        if value is not None:
            flags[f"analysis.{dest}"] = value
    # `routing` has no --cache-dir flag (it embeds nothing)
    if cache_dir := getattr(args, "cache_dir", None) or meta.settings.run.cache_dir:
        flags["run.cache_dir"] = cache_dir
    return load(args.config, flags)[0]


def _analysis_parser(prog: str, description: str, add: Callable[[Parser], None]) -> Parser:
    """`scaling` and `routing`: a finished output folder, the config's [analysis] section, this command's flags."""
    p = Parser(prog=f"python -m evaluator {prog}", description=description)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--config", type=Path, help="settings file whose [analysis] section applies (default: configs/default.toml)")
    p.add_argument("--k", type=int, help="retrieval budget (default: the run's k)")
    add(p)
    return p


def _analysis_command(prog: str, p: Parser, argv: list[str],
                      run: Callable[[argparse.Namespace, OutputDir, Settings], ScalingMeta | RoutingMeta]) -> int:
    """Runs `scaling` or `routing` (`run`) on the output folder its parser `p` reads from `argv`."""
    args = p.parse_args(argv)
    od = OutputDir(args.out_dir).require()
    _writing(args.out_dir)
    with od.writing(f"`{prog}`", make_reporter(False).info):  # one writer per output folder
        meta = run(args, od, _analysis_settings(args, od))
    print(f"{prog.capitalize()} study in {meta.timing_s:.1f}s: {args.out_dir}/{prog}.json; updated report.md "
          f"and figures/{prog}.png")
    return 0


def scaling_parser() -> Parser:
    def add(p: Parser) -> None:
        p.add_argument("--sizes", dest="scaling_sizes", metavar="N,N,...", type=_ints, help="sub-registry sizes (default from the config); the full registry is always added")
        p.add_argument("--seeds", dest="scaling_seeds", metavar="N", type=int, help=f"distractor draws per size (default {DEFAULTS.analysis.scaling_seeds})")
        p.add_argument("--subsets", dest="scaling_subsets", metavar="S,S,...", type=_csv, help="comma list of subsets or prefixes (default: every subset but the last in sorted order)")
        p.add_argument("--divergence-subset", help="subset whose top-k divergence is reported (default: the first scaling subset)")
        p.add_argument("--data", help="data folder (default: the run's, from meta.json)")
        p.add_argument("--cache-dir", help="embedding cache root (default: the run's)")
        p.add_argument("--device", default="auto", help="device for cache misses (default auto)")
        p.add_argument("--no-progress", action="store_true")

    return _analysis_parser(
        "scaling", "Scaling study (paper Table 10): RtP and PtR recall on sub-registries of growing size, from a "
        "finished output folder; no LLM call, embeddings from the run's cache.", add)


def cmd_scaling(argv: list[str]) -> int:
    return _analysis_command(
        "scaling", scaling_parser(), argv,
        lambda args, od, s: outputs.scaling_from_output(od, s, data_dir=args.data, device=args.device,
                                                    reporter=make_reporter(not args.no_progress)).meta)


def routing_parser() -> Parser:
    def add(p: Parser) -> None:
        p.add_argument("--train", dest="routing_train", metavar="S,S,...", type=_csv, help="subsets tau is tuned on for the split evaluation (default: every subset but the last in sorted order)")
        p.add_argument("--test", dest="routing_test", metavar="S,S,...", type=_csv, help="subsets it is reported on (default: the last subset in sorted order)")
        p.add_argument("--folds", dest="routing_folds", metavar="N", type=int, help=f"cross-validation folds (default {DEFAULTS.analysis.routing_folds})")
        p.add_argument("--seed", dest="routing_seed", metavar="N", type=int, help=f"seed of the fold assignment (default {DEFAULTS.analysis.routing_seed})")

    return _analysis_parser(
        "routing", "Complexity-adaptive routing (RtP when RtP's top-1 score >= tau, else PtR; also query length "
        "and clause count) from a finished output folder; no embedding, no LLM call.", add)


def cmd_routing(argv: list[str]) -> int:
    return _analysis_command(
        "routing", routing_parser(), argv,
        lambda _args, od, s: outputs.routing_from_output(od, s, make_reporter()).meta)


# ---------------------------------------------------------------- `requests export|import|run`: request files

REQUESTS_USAGE = """\
    requests export OUT.jsonl [study flags]     every chat request the study would send that is not cached
    requests import RESULTS.jsonl               store the successful results in the response cache
    requests run IN.jsonl --model P --out R.jsonl   any request file through the online engine (resumable)
    requests run IN.jsonl --model P --out R.jsonl --engine ray [--address ADDR]   the same through Ray Data LLM

Export works in rounds: the PtR planners need the discovery replies, so a second export after the first
results were imported holds them. `custom_id` is the engine's cache key, so imported results are found by
the study exactly as if they had been fetched online, and online and batch results mix."""


def _cache_root(cache_dir: str | None, config: Path | None = None) -> Path:
    s = load_settings(config)
    return Path(resolve_path(cache_dir or s.run.cache_dir))


def cmd_requests(argv: list[str]) -> int:
    actions = {"export": _requests_export, "import": _requests_import, "run": _requests_run}
    if not argv or argv[0] not in actions:
        print(f"usage: python -m evaluator requests ACTION ...\n{REQUESTS_USAGE}", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else EXIT_USAGE
    return actions[argv[0]](argv[1:])


def _requests_export(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        raise ConfigError("requests export: name the output file first: `requests export OUT.jsonl [study flags]`")
    args = run_parser().parse_args(argv[1:])
    s, inv = settings_from(args)
    _writing(Path(argv[0]).parent, resolve_path(s.run.cache_dir))
    done = request_commands.export_requests(s, inv, Path(argv[0]), make_reporter(not args.no_progress))
    n = sum(done.per_model.values())
    if n:
        per = ", ".join(f"{name} {k:,}" for name, k in done.per_model.items())
        print(f"Wrote {n:,} requests to {done.out} ({per}). Run them as a batch (or `requests run`), then "
              f"`python -m evaluator requests import RESULTS.jsonl --cache-dir {done.cache_root}` and export again "
              "for the next round (the PtR planners need the discovery replies).")
    else:
        print(f"Nothing to export: every request of this study is cached in {done.cache_root}. Run the study.")
    return 0


def requests_import_parser() -> Parser:
    ap = Parser(prog="python -m evaluator requests import",
                description="Store a results file's successful replies in the response cache.")
    ap.add_argument("results", type=Path, nargs="+", help="results JSONL (OpenAI batch output/error file, vllm run-batch output)")
    ap.add_argument("--model", help="profile the requests were made for (default: the one `requests export` recorded)")
    ap.add_argument("--cache-dir", help="cache root (default: the config's)")
    ap.add_argument("--base-url", help="the endpoint the profile's cache keys use, if it was overridden at export")
    ap.add_argument("--config", type=Path, help="settings file (for the default cache dir)")
    return ap


def _requests_import(argv: list[str]) -> int:
    ap = requests_import_parser()
    args = ap.parse_args(argv)
    root = _cache_root(args.cache_dir, args.config)
    _writing(root)
    c = import_files(args.results, root, model=args.model, base_url=args.base_url)
    kinds = f" ({', '.join(f'{k}: {n:,}' for k, n in c.error_kinds.items())})" if c.error_kinds else ""
    print(f"Imported {c.stored:,} replies into {root} ({c.already:,} were already cached); "
          f"{c.errors:,} errors{kinds} and {c.unusable:,} unusable replies were not cached.")
    for line in c.first_errors:
        print(f"  {line}")
    if c.bad_lines:
        more = f" (and {c.bad_lines - len(c.first_bad):,} more)" if c.bad_lines > len(c.first_bad) else ""
        print(f"warning: {c.bad_lines:,} line(s) of the results could not be read and were skipped: "
              f"{'; '.join(c.first_bad)}{more}", file=sys.stderr)
    if c.errors or c.unusable or c.bad_lines:
        print("Requests without a cached reply are sent again by the next export (or online by the study).")
    return 0


def requests_run_parser() -> Parser:
    ap = Parser(
        prog="python -m evaluator requests run",
        description="Send a request file (OpenAI batch JSONL) through the online engine: limits, retries, "
                    "cache, resume. Results in the same format as a provider's batch output.")
    ap.add_argument("requests", type=Path, help="request JSONL: custom_id, method, url, body")
    ap.add_argument("--model", required=True, help="model profile: sim, gemini, gpt-oss-120b, or a .toml path")
    ap.add_argument("--out", type=Path, required=True, help="results JSONL to write")
    ap.add_argument("--cache-dir", help="cache root (default: the config's); a rerun answers finished requests from it")
    ap.add_argument("--base-url", help="override the profile's endpoint")
    _rate_flags(ap)
    ap.add_argument("--config", type=Path, help="settings file (for the default cache dir)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--stop-grace", type=float, metavar="S", default=STOP_GRACE_S, help=f"seconds the calls on the wire at a stop signal get to arrive and be cached (default {STOP_GRACE_S:g})")
    ap.add_argument("--dry-run", action="store_true", help="print (and write OUT's stem + .plan.json) the requests, tokens, USD and time the file would take; send nothing")
    ray = ap.add_argument_group("Ray (--engine ray; pip install 'evaluator[ray]')")
    ray.add_argument("--engine", choices=["evaluator", "ray"], default="evaluator",
                     help="who sends: the evaluator's engine (default) or Ray Data LLM; both use and fill the same cache")
    ray.add_argument("--address", help="join this Ray cluster (e.g. auto, ray://head:10001); default: start a small local Ray")
    ray.add_argument("--processor", choices=["http", "vllm"], default="http",
                     help="http: Ray's HTTP processor against the profile's endpoint (default); vllm: the model inside Ray (needs vLLM)")
    ray.add_argument("--actors", type=_bounded(1, 256), default=1, help="Ray actors sending (or running vLLM); default 1")
    ray.add_argument("--batch-size", type=_bounded(1, 4096), help="rows per Ray batch = requests in flight per actor (default: the profile's concurrency, at most 64)")
    ray.add_argument("--qps", type=_bounded(1, 100_000), help="Ray's pace, requests per second per actor (default: the profile's rpm / 60 / actors)")
    ray.add_argument("--vllm-model", help="--processor vllm: the model to load (default: the profile's model id)")
    return ap


def _requests_run(argv: list[str]) -> int:
    ap = requests_run_parser()
    args = ap.parse_args(argv)
    ray_flags = [f for f, v in (("--address", args.address), ("--processor", args.processor != "http"),
                                ("--actors", args.actors != 1), ("--batch-size", args.batch_size), ("--qps", args.qps),
                                ("--vllm-model", args.vllm_model)) if v]
    if args.engine != "ray" and ray_flags:
        ap.error(f"{ray_flags[0]} is an option of --engine ray; add --engine ray")
    ray_opts = (RayOptions(address=args.address, processor=args.processor, batch_size=args.batch_size,
                           actors=args.actors, qps=args.qps, vllm_model=args.vllm_model)
                if args.engine == "ray" else None)
    overrides = ProfileOverrides.given_in(vars(args))
    _writing(args.out.parent, _cache_root(args.cache_dir, args.config))
    if args.dry_run:
        print(request_commands.plan_request_file(args.requests, args.model, args.out, _cache_root(args.cache_dir, args.config),
                                    **overrides.as_kwargs()))
        return 0
    done = request_commands.run_request_file(args.requests, args.model, args.out, _cache_root(args.cache_dir, args.config),
                                reporter=make_reporter(not args.no_progress), ray=ray_opts, grace_s=args.stop_grace,
                                **overrides.as_kwargs())
    n, bad = len(done.results), sum(1 for r in done.results if not r.ok)
    print(f"Wrote {n:,} results to {args.out} in {done.seconds:.1f} s: {n - bad:,} ok, {bad:,} errors; "
          + (f"{done.stats.requests:,} requests sent through Ray ({done.ray.address}; its retries not counted), "
             if done.ray is not None else f"{done.stats.requests:,} HTTP requests sent, ")
          + f"{done.stats.cache_hits:,} answered from the cache.")
    return 0


def view_parser() -> Parser:
    p = Parser(prog="python -m evaluator view",
               description="Write one self-contained HTML page (no network) to browse a finished run's queries, "
               "or several runs compared side by side; prints its path.")
    p.add_argument("out_dirs", nargs="+", type=Path, metavar="OUT", help="output folder(s) of finished runs")
    p.add_argument("--out", type=Path, help="page to write (default: OUT/view.html; needed to compare runs)")
    p.add_argument("--serve", action="store_true", help="also serve the page on 127.0.0.1 until Ctrl-C")
    p.add_argument("--port", type=_bounded(0, 65535), default=0, help="port for --serve (default: any free one)")
    return p


def cmd_view(argv: list[str]) -> int:
    p = view_parser()
    args = p.parse_args(argv)
    if len(args.out_dirs) > 1 and args.out is None:
        p.error("comparing runs writes one page for all of them: pass --out F.html")
    _writing(args.out.parent if args.out else args.out_dirs[0])
    folders = [OutputDir(d).require() for d in args.out_dirs]
    # the folder the page goes into has one writer (a study's, a `report`'s or this one), not the page's readers
    with OutputDir(args.out.parent if args.out else args.out_dirs[0]).writing("`view`", make_reporter(False).info):
        path, html = viewer.write_page(folders, args.out)
    print(path)
    if args.serve:
        srv = view_server.server(html, args.port, path)
        print(f"Serving on http://127.0.0.1:{srv.server_address[1]}/ (Ctrl-C stops)", flush=True)
        try:
            srv.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            srv.server_close()
    return 0


def models_parser() -> Parser:
    p = Parser(prog="python -m evaluator models",
               description="List the providers --model PROVIDER/MODEL knows (endpoint, key variable and whether it is "
               "set, batch API, prompt caching) and the dated prices of their known models (configs/providers.toml).")
    p.add_argument("provider", nargs="?", help="only this provider")
    return p


def cmd_models(argv: list[str]) -> int:
    p = models_parser()
    args = p.parse_args(argv)
    print(models.models_text(args.provider))
    return 0


def export_parser() -> Parser:
    p = Parser(prog="python -m evaluator export",
               description="Write a finished run's ranked lists as TREC run files (one per model, run, architecture "
               "and retriever) and its gold sets as qrels files (one per gold set), for trec_eval, pytrec_eval, "
               "ranx and ir-measures.")
    p.add_argument("format", choices=["trec"])
    p.add_argument("out_dir", type=Path, metavar="OUT", help="output folder of a finished run")
    p.add_argument("--to", type=Path, required=True, metavar="DIR", help="folder to write the files into")
    p.add_argument("--bare-qids", action="store_true", help="qid = the query id alone (e.g. a BEIR folder's own, to "
                   "meet its qrels/<split>.tsv), not <subset>/<query_id>; refused when two subsets share an id")
    return p


def cmd_export(argv: list[str]) -> int:
    p = export_parser()
    args = p.parse_args(argv)
    files = outputs.export_trec(OutputDir(args.out_dir).require(), args.to, args.bare_qids)
    runs = sum(f.suffix == ".trec" for f in files)
    qrels = sum(f.name.startswith("qrels.") for f in files)
    print(f"Wrote {runs} run file(s) and {qrels} qrels file(s) to {args.to}/ "
          f"(e.g. trec_eval -c -m ndcg_cut.5 {args.to}/qrels.api_list.txt {args.to}/<run>.trec)")
    return 0


def arch_parser() -> Parser:
    p = Parser(prog="python -m evaluator arch",
               description="`arch check FILE.py:Class`: run an architecture plugin on a small registry (examples/mcp "
               "unless --data, --tools or --queries name another) against the simulator (schemas sent, so a "
               "plugin's own structured prompt is answered with JSON valid against it) and print each query's "
               "list, trace, own calls and any breach of the contract; exit 5 when it failed on a query.")
    p.add_argument("action", choices=["check"])
    p.add_argument("spec", metavar="FILE.py:Class", help="the plugin, as --archs takes it (or package.module:Class)")
    p.add_argument("--config", type=Path, help="settings file (default: configs/default.toml)")
    p.add_argument("--data", help="data folder (registry/ and queries/) to try it on")
    p.add_argument("--tools", help="registry file or folder to try it on")
    p.add_argument("--queries", nargs="+", metavar="PATH", help="query files to try it on")
    p.add_argument("--limit", type=int, help=f"first N queries per subset (default {arch_check.LIMIT})")
    p.add_argument("--retriever", choices=RETRIEVER_CHOICES, help="the study's retriever (ctx.search's default)")
    p.add_argument("--model", action="append", dest="models",
                   help="model profile (default sim: a local simulator, nothing sent out)")
    p.add_argument("--base-url", help="override the profile's endpoint")
    p.add_argument("--structured", choices=STRUCTURED, help="how schemas are sent (default for a simulated profile: "
                   "json_schema)")
    p.add_argument("--cache-dir", help="cache root (embeddings, replies; default: the config's)")
    p.add_argument("--arch-timeout", type=float, metavar="S", help=f"the plugin's own time per query (default {DEFAULTS.run.arch_timeout_s:g})")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first query it fails on")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def cmd_arch(argv: list[str]) -> int:
    p = arch_parser()
    args = p.parse_args(argv)
    s, inv = load(args.config, _setting_flags(args), {
        "overrides": ProfileOverrides.given_in(vars(args)),
        "data_from_cli": bool(args.data), "fail_fast": args.fail_fast})
    s = arch_check.settings_for(s, args.spec, inv.cli_keys)
    _writing(resolve_path(s.run.cache_dir))
    done = arch_check.check(args.spec, s, inv, make_reporter(not args.no_progress))
    print(f"arch check {done.spec} (name {done.name!r}): {len(done.queries)} queries of {done.registry} "
          f"({done.size:,} APIs), retriever {done.retriever}, model {done.model}"
          + (f" (simulated; schemas sent as {done.structured})" if done.simulated else f" (structured {done.structured})"))
    for q in done.queries:
        print(f"\n{q.subset} query {q.query_id}: {q.text}")
        for c in q.calls:
            said = c.error if c.error is not None else (c.reply or "")
            said = " ".join(said.split())
            print(f"  call {c.version}{' (schema sent)' if c.schema else ''}: "
                  + ("FAILED " if c.error is not None else "reply ") + (said if len(said) <= 300 else said[:297] + "..."))
        b = q.block
        if b.failure is not None:
            print(f"  FAILED ({b.failure.kind}): {b.failure.error}")
            continue
        if b.errors:
            print(f"  own calls failed for good: {', '.join(f'{n} ({k})' for n, k in b.errors.items())}: not scored")
        shown = ", ".join(f"{i + 1}. {a} ({x:.4g})" for i, (a, x) in enumerate(zip(b.retrieved, b.scores, strict=True))
                          if i < 10)
        print(f"  list ({len(b.retrieved)}): {shown or 'nothing retrieved'}")
        if b.trace is not None:
            text = trace_text(b.trace) or ""
            print("  trace: " + text.replace("\n", "\n    "))
        if b.plan is not None and b.plan.llm_error is None and not b.excluded:
            print(f"  planner selected: {', '.join(b.plan.unique_selected) or 'nothing'}"
                  + (f" (parse error: {b.plan.parse_error})" if b.plan.parse_error else ""))
    failed = done.failed
    kinds = sorted({q.block.failure.kind for q in failed if q.block.failure is not None})
    print(f"\n{len(done.queries) - len(failed)} of {len(done.queries)} queries kept the contract"
          + (f"; failed: {len(failed)} ({', '.join(kinds)}): a study leaves those blocks out and exits 5" if failed
             else "."))
    return EXIT_FAILED_BLOCKS if failed else 0


HANDLERS: dict[str, Callable[[list[str]], int]] = {
    "run": cmd_run, "report": cmd_report, "cache": cmd_cache, "scaling": cmd_scaling, "routing": cmd_routing,
    "requests": cmd_requests, "view": cmd_view, "export": cmd_export, "models": cmd_models, "arch": cmd_arch,
}


# Every command's parser, by the words that name it on the command line (`requests export` takes the study's
# flags); tests/unit/test_docs.py checks every flag the docs name against them.
PARSERS: dict[str, Callable[[], Parser]] = {
    "run": run_parser, "report": report_parser, "cache": cache_parser, "scaling": scaling_parser,
    "routing": routing_parser, "requests export": run_parser, "requests import": requests_import_parser,
    "requests run": requests_run_parser, "view": view_parser, "export": export_parser, "models": models_parser,
    "arch": arch_parser,
}


class _StderrHandler(logging.StreamHandler):
    """Writes to the `sys.stderr` of the moment (a test's capture, a redirected stream), not the one at start."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def _log_to_stderr() -> None:
    """The engine's `logging` warnings (a dropped request field, a lost claim renewal) as lines on stderr."""
    root = logging.getLogger("evaluator")
    if any(isinstance(h, _StderrHandler) for h in root.handlers):
        return  # `main` called again in one process
    handler = _StderrHandler()
    handler.setLevel(logging.WARNING)  # the logger's own level is left alone (tests raise it to DEBUG)
    handler.setFormatter(logging.Formatter("warning: %(message)s"))
    handler.addFilter(RedactFilter())
    root.addHandler(handler)


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: TextIO | None = None, line: str | None = None) -> None:
    """A Python warning (a library's, a plugin's) as one line like every other, not the source line it came from."""
    text = " ".join(str(message).split())
    sys.stderr.write(redact(f"warning: {text} ({category.__name__} in {Path(filename).name}:{lineno})") + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    new_invocation()  # a second command in this process is a run of its own (llm/cache.py, `reusable`)
    _log_to_stderr()
    warnings.showwarning = _one_line_warning  # no raw library warning (with its source line) on stderr
    interrupt_on_stop_signals()  # SIGTERM/SIGHUP end the command as Ctrl-C does (core/aio.py)
    command = argv[0] if argv and argv[0] in HANDLERS else "run"
    rest = argv[1:] if argv and argv[0] in HANDLERS else argv
    sys.excepthook = lambda *exc: sys.stderr.write(redacted_traceback(*exc))  # even a crash's traceback carries no key
    try:
        return HANDLERS[command](rest)
    except SystemExit as e:  # argparse: --help (0) or a usage error already printed (2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    except EvaluatorError as e:  # each kind says its exit code and its line (core/errors.py)
        print(redact(e.line()), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        how = f" by {stop_signal()}" if stop_signal() else ""
        print(f"\ninterrupted{how}: finished LLM calls are cached; rerun the same command to resume.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except sqlite3.OperationalError as e:  # a cache or job database on a full disk (SQLITE_FULL)
        if "full" not in str(e) and getattr(e, "sqlite_errorname", "") != "SQLITE_FULL":
            raise
        return _fs_error(OSError(errno.ENOSPC, str(e)))
    except OSError as e:
        return _fs_error(e)
    finally:
        _WRITES.clear()


def end_process(code: int) -> NoReturn:
    """The process ends with `code` once the output and the log are flushed, without the interpreter's teardown
    (`python -m evaluator` only; evaluator/__main__.py says why)."""
    logging.shutdown()
    with contextlib.suppress(OSError):  # a closed pipe (`| head`): nothing more to say
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _fs_error(e: OSError) -> int:
    """A file system failure nothing checked for (disk full, a folder removed mid-run): one line naming the file,
    or else the folders the command writes, not a traceback. Finished LLM calls are in the cache, so a rerun pays
    for nothing twice."""
    where = f" {e.filename}" if e.filename else (f" {' or '.join(_WRITES)}" if _WRITES else "")
    fix = ("Free space on that disk (or pass another --out / --cache-dir)" if e.errno in (errno.ENOSPC, errno.EDQUOT)
           else "Fix the path or free space")
    print(redact(f"error: cannot read or write{where}: {e.strerror or e}. {fix} and rerun."), file=sys.stderr)
    return EXIT_STOPPED
