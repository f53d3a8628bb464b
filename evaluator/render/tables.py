"""The main study's tables (paper Tables 1–9 and 11, errors) as Markdown sections, from `MainResult`.

Each function is named after what its table shows (`main_results`, `search_width`, ...); the caption keeps
the paper's table number."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from evaluator.analysis import stats
from evaluator.analysis.compare import Comparison
from evaluator.analysis.examples import CONTRAST_RULE, TRAJECTORY_RULE, Contrasts, Trajectory
from evaluator.analysis.main_study import MainResult
from evaluator.analysis.metric_defs import (
    NWAY_METRICS,
    RANK_METRICS,
    RETRIEVAL_METRICS,
    Metric,
    MetricName,
    tokens_metric,
)
from evaluator.render.fmt import (
    DASH,
    arch_label,
    best,
    better,
    bold,
    code,
    fmetric,
    fnum,
    format_p,
    fpct,
    ptest,
    section,
    table,
    text,
)
from evaluator.results.schema import FAILURE_KINDS


@dataclass
class Labels:
    """What every caption states about the study, resolved once from meta."""

    simulated: set[str]
    embedder: str
    registry_size: str
    registry_choice: str
    runs: str
    model_ids: dict[str, str] = field(default_factory=dict)
    retriever: str = "dense"


@dataclass
class Ctx:
    r: MainResult
    info: Labels

    @property
    def s(self) -> stats.Summary:
        return self.r.summary

    def label(self, model: str | None, gold: str | None = None) -> str:
        bits = [f"model `{model}`" + (" (simulated LLM)" if model in self.info.simulated else "")
                if model else "retrieval only (no LLM)"]
        if gold:
            bits.append(f"gold `{gold}`")
        if self.info.retriever != "dense":
            bits.append(f"retriever `{self.info.retriever}`")
        bits += [f"embedder `{self.info.embedder}`", f"registry {self.info.registry_size} APIs "
                 f"({self.info.registry_choice})", f"runs {self.info.runs}", f"k = {self.r.k}"]
        return ", ".join(bits) + self.scored(model)

    def scored(self, model: str | None) -> str:
        """n actually scored per architecture (summed over subsets and runs) and truncated replies."""
        sc = self.r.scored
        parts = []
        if (rr := sc.get((None, "rtp"))) is not None:
            parts.append(f"RtP retrieval {rr.retrieval}")
        rtp, ptr = sc.get((model, "rtp")), sc.get((model, "ptr"))
        if model is not None and rtp is not None:
            parts.append(f"RtP planner {rtp.planner}")
        if model is not None and ptr is not None:
            parts += [f"PtR retrieval {ptr.retrieval}", f"PtR planner {ptr.planner}"]
        for arch in extra_archs(self, model):  # any architecture beyond the paper's two, by its name
            if (ex := sc.get((model, arch))) is not None:
                parts += [f"{arch} retrieval {ex.retrieval}", f"{arch} planner {ex.planner}"]
        text = "; n scored (summed over runs): " + ", ".join(parts) if parts else ""
        if model is not None:
            text += f"; truncated replies (finish_reason length): {(rtp.truncated if rtp else 0) + (ptr.truncated if ptr else 0)}"
            cuts: dict[str, int] = {}
            for sc_ in (rtp, ptr):
                for cause, n in (sc_.cut.items() if sc_ else ()):
                    cuts[cause] = cuts.get(cause, 0) + n
            # by cause: max_tokens, context (the server's context ended it), content_filter, or the finish_reason
            text += f"; cut replies: {sum(cuts.values())}" + (
                " (" + ", ".join(f"{c} {n}" for c, n in sorted(cuts.items())) + ")" if cuts else "")
        return text

    def n(self, subset: str) -> str:
        return f"{text(subset)} (n={self.s.checks.queries_per_subset.get(subset, '?')})"

    def count(self, model: str | None, subset: str, arch: str, metric: MetricName) -> str:
        r = self.s.row(model, subset, arch, metric)
        return DASH if r is None else str(int(math.fsum(r.values)))


def has(s: stats.Summary, model: str | None, arch: str) -> bool:
    return any(r.model == model and r.arch == arch for r in s.rows)


def extra_archs(c: Ctx, model: str | None) -> list[str]:
    """The architectures beyond RtP and PtR that ran for this model (their columns follow RtP's and PtR's)."""
    if model is None:
        return []
    return [a for a in c.s.archs if a not in ("rtp", "ptr") and has(c.s, model, a)]


def _rtp_model(metric: Metric, model: str | None) -> str | None:
    """The model of RtP's row of `metric`: none for pure retrieval (one deterministic value per query)."""
    return None if metric in RETRIEVAL_METRICS else model


def _gold(metric: Metric, gold: str | None) -> str | None:
    """The gold of a row of `metric`: none where it is not computed per gold set."""
    return gold if metric.spec.gold else None


def _best(metric: Metric, rows: Sequence[stats.Row | None]) -> list[bool]:
    """Which rows to bold: the highest mean of a metric where higher is better, none of a descriptive one."""
    return best(rows) if metric.spec.higher_is_better else [False] * len(rows)


def _ttest(metric: Metric) -> str:
    """The paper's t-test of PtR against RtP on `metric`: one-sample against RtP's deterministic retrieval value,
    else two-sample over runs (`stats`)."""
    return "ttest_1samp" if metric in RETRIEVAL_METRICS else "ttest_ind"


def _at_k_cells(c: Ctx, model: str | None, sub: str, metric: Metric, k: int, gold: str, with_ptr: bool,
                extra: Sequence[str] = ()) -> list[str]:
    """RtP's value (deterministic: the retrieval-only row) and, with PtR and any other architecture, theirs
    beside it, the best bold."""
    r = c.s.row(None, sub, "rtp", metric, k, gold)
    if not with_ptr and not extra:
        return [fmetric(r, metric)]
    rows = [r] + ([c.s.row(model, sub, "ptr", metric, k, gold)] if with_ptr else []) + [
        c.s.row(model, sub, a, metric, k, gold) for a in extra]
    return [bold(fmetric(x, metric), on) for x, on in zip(rows, _best(metric, rows), strict=True)]


def _at_k_archs(with_ptr: bool, extra: Sequence[str]) -> list[str]:
    return ["RtP", *(["PtR"] if with_ptr else []), *extra]


def _more_archs_note(extra: Sequence[str]) -> str:
    return (f" {', '.join(f'`{a}`' for a in extra)}: mean±std over runs, as PtR." if extra else "")


def metric_at_k(c: Ctx, model: str | None, gold: str, metric: Metric = Metric.RECALL) -> str:
    subs = c.s.subsets
    with_ptr = model is not None and has(c.s, model, "ptr")
    extra = extra_archs(c, model)
    header = ["k"] + [f"{text(sub)} {a}" for sub in subs for a in _at_k_archs(with_ptr, extra)]
    body = []
    for k in c.r.ks:
        line = [str(k)]
        for sub in subs:
            line += _at_k_cells(c, model, sub, metric, k, gold, with_ptr, extra)
        body.append(line)
    return section(f"Table 1{'' if metric is Metric.RECALL else 'b'}: {metric.spec.label} at retrieval budget k",
                    f"{c.label(model, gold)}. RtP is deterministic (one value)"
                    + ("; PtR mean±std over runs. Bold: better architecture." if with_ptr else ".")
                    + _more_archs_note(extra),
                    table(header, body))


def _relevance(c: Ctx) -> str:
    if not c.r.graded:
        return "Binary relevance."
    return (f"Graded relevance ({c.r.graded} queries carry grades other than 1): rel_i is the gold API's grade "
            "(NDCG's gain, linear), the ideal list the highest grades first; MRR, COMP, recall and precision count "
            "every grade > 0 as relevant.")


def rank_metrics_at_k(c: Ctx, model: str | None, gold: str) -> str:
    """NDCG@k, MRR@k and COMP@k per subset and k (the k-ablation of the rank metrics)."""
    with_ptr = model is not None and has(c.s, model, "ptr")
    extra = extra_archs(c, model)
    header = ["Subset", "k"] + [f"{m.spec.label} {a}" for m in RANK_METRICS for a in _at_k_archs(with_ptr, extra)]
    body = []
    for sub in c.s.subsets:
        for k in c.r.ks:
            line = [c.n(sub), str(k)]
            for metric in RANK_METRICS:
                line += _at_k_cells(c, model, sub, metric, k, gold, with_ptr, extra)
            body.append(line)
    return section("Table 1c: Rank metrics at retrieval budget k",
                   f"{c.label(model, gold)}. {_relevance(c)} NDCG@k: DCG = Σ rel_i/log2(i+1) over the top k, "
                   "ideal DCG over min(|G|, k) gold APIs; MRR@k: 1/rank of the first gold API in the top k (0 if "
                   "none); COMP@k: 1 if every gold API is in the top k (0 whenever |G| > k). Per query, equal to "
                   "pytrec_eval's `ndcg_cut`, `recip_rank` (list cut to k) and `recall` = 1 (tests/unit/test_metrics_ir.py). "
                   "RtP is deterministic (one value)" + ("; PtR mean±std over runs. Bold: better architecture."
                                                        if with_ptr else ".") + _more_archs_note(extra),
                   table(header, body))


def architectures_compared(c: Ctx, model: str, gold: str) -> str:
    """Every architecture of the study side by side at the main k: the retrieval metrics, pass rate and tokens."""
    k = c.r.k
    archs = [a for a in c.s.archs if has(c.s, model, a) or (a == "rtp" and has(c.s, None, a))]
    header = ["Subset", "Architecture"] + [m.spec.label for m in NWAY_METRICS] + [Metric.TOKENS_TOTAL.spec.label]
    body = []
    for sub in c.s.subsets:
        cols = [[c.s.row(_rtp_model(m, model) if a == "rtp" else model, sub, a, m, k, _gold(m, gold)) for a in archs]
                for m in NWAY_METRICS]
        marks = [_best(m, col) for m, col in zip(NWAY_METRICS, cols, strict=True)]
        for i, a in enumerate(archs):
            tokens = c.s.row(model, sub, a, Metric.TOKENS_TOTAL, k)
            body.append([c.n(sub), arch_label(a)]
                        + [bold(fmetric(col[i], m), mk[i]) for m, col, mk in zip(NWAY_METRICS, cols, marks, strict=True)]
                        + [fnum(tokens.mean if tokens else None, Metric.TOKENS_TOTAL.spec.digits)])
    return section("Table N1: Architectures compared",
                   f"{c.label(model, gold)}. Every architecture of the run at k = {k}: mean±std over runs (RtP's "
                   "retrieval: one deterministic value). Bold: best architecture of the subset. Tokens: all calls "
                   "of the architecture per query (mean).", table(header, body))


def pairwise_tests(c: Ctx, cmp: Comparison, model: str, gold: str) -> str:
    """Every pair of architectures: paired Wilcoxon per metric, Holm-adjusted within each subset and metric."""
    header = ["Subset", "Metric", "A", "B", "n", "mean A", "mean B", "wins A / B", "p (Wilcoxon)", "p (Holm)"]
    body = []
    for sub in c.s.subsets:
        for metric in NWAY_METRICS:
            for p in cmp.pairs_of(model, sub, metric, _gold(metric, gold)):
                body.append([c.n(sub), metric.spec.label, arch_label(p.a), arch_label(p.b), str(p.n), fnum(p.mean_a),
                             fnum(p.mean_b), f"{p.wins_a} / {p.wins_b}", format_p(p.pvalue),
                             f"{format_p(p.p_holm)} {p.stars}".strip() if p.p_holm is not None else DASH])
    return section("Table N2: Every pair of architectures",
                   f"{c.label(model, gold)}. Paired Wilcoxon signed-rank test on run-averaged per-query values at "
                   f"k = {cmp.k} (RtP's retrieval: its one value per query), the queries both architectures scored; "
                   "p (Holm): adjusted with Holm's step-down correction over the pairs of one subset and metric. "
                   "Stars on the adjusted p: * p<.05, ** p<.01, *** p<.001. The paper's RtP-vs-PtR tests "
                   "(Table 3) are not adjusted.", table(header, body))


def friedman_tests(c: Ctx, cmp: Comparison, model: str, gold: str) -> str:
    """All architectures at once per subset and metric (Friedman)."""
    header = ["Subset", "Metric", "Architectures", "n", "χ²", "p (Friedman)"]
    body = []
    for sub in c.s.subsets:
        for metric in NWAY_METRICS:
            f = cmp.friedman_of(model, sub, metric, _gold(metric, gold))
            if f is not None:
                body.append([c.n(sub), metric.spec.label, ", ".join(arch_label(a) for a in f.archs), str(f.n),
                             fnum(f.statistic, 2), f"{format_p(f.pvalue)} {f.stars}".strip()
                             if f.pvalue is not None else DASH])
    return section("Table N3: All architectures at once",
                   f"{c.label(model, gold)}. Friedman's test (scipy.stats.friedmanchisquare) on the run-averaged "
                   "per-query values of the queries every architecture scored; – when undefined (every query "
                   "ties across the architectures).", table(header, body))


def main_results(c: Ctx, model: str, gold: str) -> str:
    k = c.r.k
    header = ["Subset", "Metric", "RtP mean", "RtP ±std", "PtR mean", "PtR ±std", "p (t-test)", "p (Wilcoxon)",
              "wins RtP / PtR / ties"]
    body = []
    for sub in c.s.subsets:
        for metric in (Metric.PASS, Metric.PRECISION, Metric.RECALL):
            g = _gold(metric, gold)
            r = c.s.row(_rtp_model(metric, model), sub, "rtp", metric, k, g)
            p = c.s.row(model, sub, "ptr", metric, k, g)
            if r is None and p is None:
                continue
            br, bp = better(r, p)
            tt = c.s.test(model, sub, metric, k, g, _ttest(metric))
            wx = c.s.test(model, sub, metric, k, g, "wilcoxon")
            wins = DASH
            if metric is Metric.RECALL:
                wr, wp, ti = (c.s.row(model, sub, a, m, k, gold) for a, m in
                              (("rtp", Metric.WINS), ("ptr", Metric.WINS), ("both", Metric.TIES)))
                if wr and wp and ti:
                    wins = f"{wr.mean:.0f} / {wp.mean:.0f} / {ti.mean:.0f}"
            body.append([c.n(sub), metric.spec.label, bold(fnum(r.mean if r else None), br), fnum(r.std if r else None),
                         bold(fnum(p.mean if p else None), bp), fnum(p.std if p else None), ptest(tt), ptest(wx),
                         wins])
    return section("Table 3: Main results", f"{c.label(model, gold)}. p: one-sample t-test for precision/recall "
                    "(PtR per-run means vs deterministic RtP), two-sample t-test for pass rate; Wilcoxon: paired "
                    "per-query signed-rank on run-averaged values. Wins on run-averaged per-query recall. "
                    "* p<.05, ** p<.01, *** p<.001.", table(header, body))


def compact_results(c: Ctx, model: str, gold: str) -> str:
    k = c.r.k
    header = ["Subset", "P RtP", "P PtR", "R RtP", "R PtR", "Pass RtP", "Pass PtR"]
    body = []
    for sub in c.s.subsets:
        line = [c.n(sub)]
        for metric in (Metric.PRECISION, Metric.RECALL, Metric.PASS):
            g = _gold(metric, gold)
            r = c.s.row(_rtp_model(metric, model), sub, "rtp", metric, k, g)
            p = c.s.row(model, sub, "ptr", metric, k, g)
            t = c.s.test(model, sub, metric, k, g, _ttest(metric))
            br, bp = better(r, p)
            sup = f"<sup>{t.stars}</sup>" if t and t.stars else ""
            line += [bold(fmetric(r, metric), br), bold(fmetric(p, metric), bp) + sup]
        body.append(line)
    return section(f"Table 11: {model} (compact)", f"{c.label(model, gold)}. Superscripts on PtR: t-test of "
                    "the PtR–RtP difference (one-sample for P/R, two-sample for pass rate).", table(header, body))


STUB_COLUMNS = (Metric.GEN, Metric.STUBS_PER_QUERY, Metric.STUB_UNIQUE, Metric.STUB_MATCH, Metric.STUB_COS_CORRECT,
                Metric.STUB_COS_INCORRECT)


def stub_generation(c: Ctx, model: str, gold: str) -> str:
    header = ["Subset"] + [m.spec.label for m in STUB_COLUMNS]
    body = []
    for sub in c.s.subsets:
        body.append([c.n(sub)] + [fmetric(c.s.row(model, sub, "ptr", m, None, _gold(m, gold)), m)
                                  for m in STUB_COLUMNS])
    score = "cosine" if c.info.retriever == "dense" else f"{c.info.retriever} score"
    return section("Table 4: Stub generation", f"{c.label(model, gold)}. Match%: stubs whose top-1 API is gold "
                    f"(pooled over stubs); Cos: mean {score} of a stub to its top-1 API.", table(header, body))


def budget_equivalent_k(width: float | None, ks: Sequence[int]) -> int | None:
    if width is None or not ks:
        return None
    return min(ks, key=lambda kk: (abs(kk - width), kk))


def search_width(c: Ctx, model: str, gold: str) -> str:
    k = c.r.k
    header = ["Subset", "Stubs/q", f"PtR eff. width (k={k})", "RtP eff. width", "Budget-equiv. k",
              "RtP recall (budget-equiv.)", f"PtR recall (k={k})"] + [f"PtR width k={kk}" for kk in c.r.ks]
    body = []
    for sub in c.s.subsets:
        w = c.s.row(model, sub, "ptr", Metric.WIDTH, k)
        beq = budget_equivalent_k(w.mean if w else None, c.r.ks)
        rr = c.s.row(None, sub, "rtp", Metric.RECALL, beq, gold) if beq else None
        body.append([c.n(sub), fmetric(c.s.row(model, sub, "ptr", Metric.STUBS_PER_QUERY), Metric.STUBS_PER_QUERY),
                     fmetric(w, Metric.WIDTH), str(k), str(beq) if beq else DASH, fmetric(rr, Metric.RECALL),
                     fmetric(c.s.row(model, sub, "ptr", Metric.RECALL, k, gold), Metric.RECALL)]
                    + [fmetric(c.s.row(model, sub, "ptr", Metric.WIDTH, kk), Metric.WIDTH) for kk in c.r.ks])
    return section("Table 5: Effective search width", f"{c.label(model, gold)}. RtP searches exactly k candidates; "
                    "PtR's width is the size of the deduplicated union of per-stub top-k lists before the cut. "
                    "Budget-equivalent RtP recall from Table 1.", table(header, body))


# Table 6's rows: each metric with the architectures it is shown for, then per gold set the complete-miss ones.
TRAJECTORY_ROWS = ((Metric.SELECTION_RATE, ("ptr", "rtp")), (Metric.JACCARD_SELECTED, ("both",)),
                   (Metric.BOTH_REFUSED, ("both",)), (Metric.PLAN_STEPS, ("ptr", "rtp")),
                   (Metric.APIS_NAMED, ("ptr", "rtp")), (Metric.FIDELITY, ("ptr", "rtp")))
ON_MISS_ROWS = (Metric.MISS, Metric.MISS_WRONG_TOOL, Metric.MISS_REFUSED)


def trajectories(c: Ctx, model: str) -> str:
    k = c.r.k
    # (the row's name, architecture, metric, gold)
    rows: list[tuple[str, str, Metric, str | None]] = [
        (m.spec.label, arch, m, None) for m, archs in TRAJECTORY_ROWS for arch in archs]
    for gold in c.r.golds:
        rows += [(f"{m.spec.label} [{gold}]", arch, m, gold) for m in ON_MISS_ROWS for arch in ("ptr", "rtp")]
    header = ["Metric", "Arch."] + c.s.subsets
    body = []
    for name, arch, metric, gold_of in rows:
        # RtP's complete-miss rate is pure retrieval: deterministic, stored under model = null.
        m = _rtp_model(metric, model) if arch == "rtp" else model
        body.append([name, {"ptr": "PtR", "rtp": "RtP", "both": "both"}[arch]]
                    + [fmetric(c.s.row(m, sub, arch, metric, k, gold_of), metric) for sub in c.s.subsets])
    return section("Table 6: Trajectories", f"{c.label(model)}. Selection rate = |selected∩R|/|R|; fidelity = "
                    "|selected∩R|/|selected| (queries with a selection); Jaccard of planner-selected sets "
                    "(both empty = 1.0).", table(header, body))


def selection_divergence(c: Ctx, model: str) -> str:
    k = c.r.k
    header = ["Subset", "n", "Identical", "Divergent"] + [f"Divergent k={kk}" for kk in c.r.ks]
    body = []
    for sub in c.s.subsets:
        d = c.s.row(model, sub, "both", Metric.DIVERGENT, k)
        n = c.s.checks.queries_per_subset.get(sub, "?")
        body.append([sub, str(n), fpct(1 - d.mean if d and d.mean is not None else None), fmetric(d, Metric.DIVERGENT)]
                    + [fmetric(c.s.row(model, sub, "both", Metric.DIVERGENT, kk), Metric.DIVERGENT) for kk in c.r.ks])
    return section("Table 7: Tool selection divergence", f"{c.label(model)}. Fraction of queries whose RtP and "
                    "PtR top-k sets differ (mean±std over runs).", table(header, body))


def inference_cost(c: Ctx, model: str) -> str:
    k = c.r.k
    header = ["Subset", "RtP tokens/q", "PtR tokens/q", "Overhead", "RtP completion/q", "PtR completion/q",
              "Completion overhead"] + [f"ΔR [{g}]" for g in c.r.golds] + [
        "PtR discovery prompt / completion", "PtR planner prompt / completion", "RtP planner prompt / completion"]
    body = []
    for sub in c.s.subsets:
        rt = c.s.row(model, sub, "rtp", Metric.TOKENS_TOTAL, k)
        pt = c.s.row(model, sub, "ptr", Metric.TOKENS_TOTAL, k)
        over = (pt.mean - rt.mean) / rt.mean if rt and pt and rt.mean and pt.mean is not None else None
        rc, pcomp = completion(c, model, sub, "rtp"), completion(c, model, sub, "ptr")
        cover = (pcomp - rc) / rc if rc and pcomp is not None else None
        deltas = []
        for gold in c.r.golds:
            rr = c.s.row(None, sub, "rtp", Metric.RECALL, k, gold)
            pr = c.s.row(model, sub, "ptr", Metric.RECALL, k, gold)
            deltas.append(f"{pr.mean - rr.mean:+.3f}" if rr and pr and rr.mean is not None and pr.mean is not None
                          else DASH)

        def pc(arch: str, call: str, sub: str = sub) -> str:
            a = c.s.row(model, sub, arch, tokens_metric(call, "prompt"), k)
            b = c.s.row(model, sub, arch, tokens_metric(call, "completion"), k)
            return f"{fnum(a.mean if a else None, 0)} / {fnum(b.mean if b else None, 0)}"
        body.append([sub, fnum(rt.mean if rt else None, 0), fnum(pt.mean if pt else None, 0),
                     DASH if over is None else f"{100 * over:+.0f}%", fnum(rc, 0), fnum(pcomp, 0),
                     DASH if cover is None else f"{100 * cover:+.0f}%"] + deltas
                    + [pc("ptr", "discovery"), pc("ptr", "planner"), pc("rtp", "planner")])
    return section("Table 8: Inference cost", f"{c.label(model)}. Mean prompt + completion tokens per query over "
                    "all calls of the architecture (RtP: planner; PtR: discovery + planner), cached replies "
                    f"included; ΔR = PtR − RtP recall@{k}. Completion/q: completion tokens only (all calls of "
                    "the architecture); the paper's Table 8 figures match completion tokens only, so compare "
                    "those columns with it.", table(header, body))


def completion(c: Ctx, model: str, sub: str, arch: str) -> float | None:
    """Mean completion tokens per query over every call of the architecture."""
    calls = ("planner",) if arch == "rtp" else ("discovery", "planner")
    means = [r.mean for call in calls if (r := c.s.row(model, sub, arch, tokens_metric(call, "completion"), c.r.k))
             and r.mean is not None]
    return math.fsum(means) if means else None


# The Errors table's counts: of every block, then of a block with a discovery call (PtR's shape).
PLANNER_COUNTS = (Metric.N_QUERIES, Metric.PLANNER_PARSE_ERROR, Metric.PLANNER_LLM_ERROR)
DISCOVERY_COUNTS = (Metric.DISCOVERY_PARSE_ERROR, Metric.DISCOVERY_LLM_ERROR, Metric.FALLBACK)


def errors_table(c: Ctx, model: str | None) -> str:
    header = (["Subset", "Arch."] + [m.spec.label for m in (*PLANNER_COUNTS, *DISCOVERY_COUNTS, Metric.OWN_CALL_ERROR)]
              + ["failed blocks"])
    body = []
    for sub in c.s.subsets:
        for arch in ("rtp", "ptr", *extra_archs(c, model)):
            if c.s.row(model, sub, arch, Metric.N_QUERIES) is None:
                continue
            cells = [c.count(model, sub, arch, m) for m in PLANNER_COUNTS]
            # PtR and any architecture with a discovery call (a block of PtR's shape) count its errors too
            if arch == "ptr" or c.s.row(model, sub, arch, Metric.DISCOVERY_LLM_ERROR) is not None:
                cells += [c.count(model, sub, arch, m) for m in DISCOVERY_COUNTS]
            else:
                cells += [DASH] * len(DISCOVERY_COUNTS)
            own = c.s.row(model, sub, arch, Metric.OWN_CALL_ERROR)
            failed = [f"{kind} {n}" for kind in FAILURE_KINDS
                      if (n := c.count(model, sub, arch, Metric.failed(kind))) != DASH]
            body.append([sub, arch_label(arch)] + cells + ["0" if own is None else c.count(model, sub, arch,
                                                                                            Metric.OWN_CALL_ERROR),
                                                          ", ".join(failed) or "0"])
    return section("Errors", f"{c.label(model)}. Counts summed over runs. Own-call LLM errors: queries whose "
                   "architecture's own call (not the planner) failed for good; failed blocks: queries the architecture "
                   f"itself failed on, by kind ({', '.join(FAILURE_KINDS)}: it raised, broke the plugin contract, ran "
                   "past [run] arch_timeout_s, or waited on its own outcome). Both are left out of every metric and "
                   "test, and get no planner call.", table(header, body))




def worked_contrasts(c: Ctx, ex: Contrasts) -> str:
    header = ["Side", "Subset", "Query id", "Query", f"RtP R@{c.r.k}", f"PtR R@{c.r.k}", "Stubs", "Lost proper nouns"]
    body = []
    for side, items in (("RtP wins", ex.rtp_wins), ("PtR wins", ex.ptr_wins)):
        for x in items:
            q = x.query if len(x.query) <= 160 else x.query[:157] + "..."
            body.append([side, text(x.subset), text(str(x.query_id)), text(q), fnum(x.rtp_recall), fnum(x.ptr_recall),
                         ", ".join(code(s) for s in x.stubs) or DASH, text(", ".join(x.lost_nouns)) or DASH])
    if not body:
        return section("Table 2: Worked contrasts", f"{c.label(ex.model)}. Rule: {CONTRAST_RULE}",
                       "No query meets the rule in this run.")
    return section("Table 2: Worked contrasts", f"{c.label(ex.model)}. Rule: {CONTRAST_RULE}", table(header, body))


def example_trajectory(c: Ctx, t: Trajectory | None, model: str) -> str:
    title = "Table 9: Example trajectory"
    if t is None:
        return section(title, f"{c.label(model)}. Rule: {TRAJECTORY_RULE}", "No query meets the rule in this run.")

    def ids(xs: list[str]) -> str:
        return "<br>".join(code(x) for x in xs) or DASH

    def steps(xs: list[str]) -> str:
        return "<br>".join(f"{i + 1}. {text(x)}" for i, x in enumerate(xs)) or DASH

    body = [["Query", text(f"{t.subset} #{t.query_id}: {t.query}"), ""],
            ["Stubs (PtR discovery)", DASH, ids(t.stubs)],
            [f"Retrieved top-{t.k}", ids(t.rtp_top), ids(t.ptr_top)],
            ["Plan steps", steps(t.rtp_steps), steps(t.ptr_steps)],
            ["Selected APIs", ids(t.rtp_selected), ids(t.ptr_selected)]]
    return section(title, f"{c.label(model)}. Rule: {TRAJECTORY_RULE}", table(["", "RtP", "PtR"], body))
