"""The main study from the records: the summary (rows, tests), how many queries each architecture had
scored, truncated replies, the worked examples, and which tables cannot be made and why."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from evaluator.analysis import compare, examples, stats
from evaluator.results.schema import GOLDS, Meta, Record
from evaluator.results.stream import in_key_order


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
    graded: int = 0  # queries whose gold carries grades other than 1 (graded relevance: NDCG gains the grade)


class ScoredCounts:
    """`Scored` per (model, arch), from records given one at a time."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str | None, str], Scored] = {}
        self._rtp_queries: set[tuple[str, object]] = set()

    def add(self, r: Record) -> None:
        out, rtp_queries = self.counts, self._rtp_queries
        if r.rtp is not None:
            if (r.subset, r.query_id) not in rtp_queries:  # RtP retrieval is scored once per query
                rtp_queries.add((r.subset, r.query_id))
                out.setdefault((None, "rtp"), Scored()).retrieval += int(not r.rtp.excluded)
            if r.rtp.plan is not None:
                sc = out.setdefault((r.model, "rtp"), Scored())
                sc.planner += int(not r.rtp.excluded and r.rtp.plan.usable)
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
            excluded = block.excluded
            sc = out.setdefault((r.model, name), Scored())
            sc.retrieval += int(not excluded)
            sc.planner += int(not excluded and block.plan_usable)
            sc.truncated += block.truncated_replies()
            sc.add_cuts(block.cut_replies())


class _Seen:
    """What the main study needs of the records beside the summary, gathered in the summary's one pass."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.golds: dict[str, None] = {}  # gold sets some query has
        self.golds_differ: set[tuple[str, str]] = set()  # pairs of gold sets unequal for some query
        self.graded: set[tuple[str, object]] = set()  # queries with graded gold (Record.grades)
        self.ptr: set[str | None] = set()  # models with a PtR block
        self.rtp_plan: set[str | None] = set()  # models with an RtP planner
        self.contrasts: dict[str, examples.ContrastPicker] = {}
        self.trajectories: dict[str, examples.TrajectoryPicker] = {}
        self.records = 0

    def add(self, r: Record) -> None:
        self.records += 1
        sets = {g: r.gold_set(g) for g in GOLDS}
        for i, g in enumerate(GOLDS):
            if sets[g]:
                self.golds.setdefault(g)
            self.golds_differ.update((g, h) for h in GOLDS[i + 1:] if sets[g] != sets[h])
        if r.grades:
            self.graded.add((r.subset, r.query_id))
        if r.ptr is not None:
            self.ptr.add(r.model)
        if r.rtp is not None and r.rtp.plan is not None:
            self.rtp_plan.add(r.model)
        if r.model is not None:
            if r.model not in self.contrasts:
                self.contrasts[r.model] = examples.ContrastPicker(r.model, self.k)
                self.trajectories[r.model] = examples.TrajectoryPicker(r.model, self.k)
            self.contrasts[r.model].add(r)
            self.trajectories[r.model].add(r)


def _tapped(records: Iterable[Record], *sinks: Callable[[Record], None]) -> Iterator[Record]:
    for r in records:
        for sink in sinks:
            sink(r)
        yield r


def main_study(records: Iterable[Record], meta: Meta) -> MainResult:
    """One pass over the records (a stream over queries.jsonl is read once): the summary and, beside it, the
    counts, the gold sets present and the worked examples."""
    k = meta.k
    ks = sorted(set(meta.ks) | {k})
    seen = _Seen(k)
    scored = ScoredCounts()
    summary = stats.summarize(_tapped(in_key_order(records), seen.add, scored.add), ks, k, ordered=True)
    golds = [g for g in GOLDS if g in seen.golds]
    skipped = [f"Tables for gold `{g}`: no query has a `{g}` gold set." for g in GOLDS if g not in golds]
    if len(golds) > 1 and seen.records and not any((golds[0], g) in seen.golds_differ for g in golds[1:]):
        # one gold set given (custom query files): the other tables would repeat the first ones
        skipped += [f"Tables for gold `{g}`: identical to `{golds[0]}` for every query." for g in golds[1:]]
        golds = golds[:1]
    res = MainResult(summary, k, ks, golds, scored.counts, skipped=skipped, graded=len(seen.graded))
    if len(summary.archs) >= 3 and summary.models:
        res.comparison = compare.architectures(summary, k)
    models = summary.models
    if not models:
        res.skipped.append("Tables 2–9 and 11 (planner, stubs, trajectories, tokens): retrieval-only run, no LLM.")
    for m in models:
        has_ptr, has_rtp_plan = m in seen.ptr, m in seen.rtp_plan
        if has_ptr and has_rtp_plan:
            res.contrasts[m] = seen.contrasts[m].result()
            res.trajectories[m] = seen.trajectories[m].result()
        else:
            missing = "PtR" if not has_ptr else "RtP"
            res.skipped.append(f"Model `{m}`, Tables 2, 7 and 9 (RtP vs PtR comparisons): {missing} was not run.")
            if not has_ptr:
                res.skipped.append(f"Model `{m}`, Tables 4 and 5 (stubs, search width): PtR was not run.")
    return res
