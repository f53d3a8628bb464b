"""The main study from the records: the summary (rows, tests), how many queries each architecture had
scored, truncated replies, the worked examples, and which tables cannot be made and why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from evaluator.analysis import compare, examples, stats
from evaluator.results.schema import GOLDS, Meta, PtrBlock, Record


@dataclass
class Scored:
    """Per (model, arch), summed over subsets and runs: queries whose retrieval / planner output was
    scored, and replies cut off at max_tokens."""

    retrieval: int = 0
    planner: int = 0
    truncated: int = 0
    cut: dict[str, int] = field(default_factory=dict)  # replies cut short, by cause (schema ArchBlock.cut_replies)

    def add_cuts(self, causes: list[str]) -> None:
        for c in causes:
            self.cut[c] = self.cut.get(c, 0) + 1


@dataclass
class MainResult:
    summary: stats.Summary
    k: int
    ks: list[int]
    golds: list[str]  # gold sets some query has; the others' tables are skipped
    scored: dict[tuple[str | None, str], Scored] = field(default_factory=dict)
    contrasts: dict[str, examples.Contrasts] = field(default_factory=dict)
    trajectories: dict[str, examples.Trajectory | None] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # one line each: table or analysis, and why
    # Every pair of architectures (Holm) and Friedman across them, with three or more; None with fewer (or no
    # model), where the paper's RtP-vs-PtR tests (summary.tests) are the comparison.
    comparison: compare.Comparison | None = None


def scored_counts(records: Sequence[Record]) -> dict[tuple[str | None, str], Scored]:
    out: dict[tuple[str | None, str], Scored] = {}
    rtp_queries: set[tuple[str, object]] = set()
    for r in records:
        if r.rtp is not None:
            if (r.subset, r.query_id) not in rtp_queries:  # RtP retrieval is scored once per query
                rtp_queries.add((r.subset, r.query_id))
                out.setdefault((None, "rtp"), Scored()).retrieval += 1
            if r.rtp.plan is not None:
                sc = out.setdefault((r.model, "rtp"), Scored())
                sc.planner += int(r.rtp.plan.usable)
                sc.truncated += r.rtp.truncated_replies()
                sc.add_cuts(r.rtp.cut_replies())
        if r.ptr is not None:
            sc = out.setdefault((r.model, "ptr"), Scored())
            sc.retrieval += int(not r.ptr.excluded)
            sc.planner += int(not r.ptr.excluded and r.ptr.plan_usable)
            sc.truncated += r.ptr.truncated_replies()
            sc.add_cuts(r.ptr.cut_replies())
        for name in r.arch_names:
            if name in ("rtp", "ptr") or (block := r.arch(name)) is None:
                continue
            excluded = isinstance(block, PtrBlock) and block.excluded
            sc = out.setdefault((r.model, name), Scored())
            sc.retrieval += int(not excluded)
            sc.planner += int(not excluded and block.plan_usable)
            sc.truncated += block.truncated_replies()
            sc.add_cuts(block.cut_replies())
    return out


def main_study(records: Sequence[Record], meta: Meta) -> MainResult:
    k = meta.k
    ks = sorted(set(meta.ks) | {k})
    summary = stats.summarize(records, ks, k)
    golds = [g for g in GOLDS if any(r.gold_set(g) for r in records)]
    skipped = [f"Tables for gold `{g}`: no query has a `{g}` gold set." for g in GOLDS if g not in golds]
    if len(golds) > 1 and records and all(r.gold_set(golds[0]) == r.gold_set(g) for r in records for g in golds[1:]):
        # one gold set given (custom query files): the other tables would repeat the first ones
        skipped += [f"Tables for gold `{g}`: identical to `{golds[0]}` for every query." for g in golds[1:]]
        golds = golds[:1]
    res = MainResult(summary, k, ks, golds, scored_counts(records), skipped=skipped)
    if len(summary.archs) >= 3 and summary.models:
        res.comparison = compare.architectures(summary, k)
    models = summary.models
    if not models:
        res.skipped.append("Tables 2–9 and 11 (planner, stubs, trajectories, tokens): retrieval-only run, no LLM.")
    for m in models:
        has_ptr = any(r.model == m and r.ptr is not None for r in records)
        has_rtp_plan = any(r.model == m and r.rtp is not None and r.rtp.plan is not None for r in records)
        if has_ptr and has_rtp_plan:
            res.contrasts[m] = examples.contrasts(records, m, k)
            res.trajectories[m] = examples.trajectory(records, m, k)
        else:
            missing = "PtR" if not has_ptr else "RtP"
            res.skipped.append(f"Model `{m}`, Tables 2, 7 and 9 (RtP vs PtR comparisons): {missing} was not run.")
            if not has_ptr:
                res.skipped.append(f"Model `{m}`, Tables 4 and 5 (stubs, search width): PtR was not run.")
    return res
