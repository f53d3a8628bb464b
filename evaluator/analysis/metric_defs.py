"""Every metric of the study, defined once: its saved name, what it counts (with its formula), how it is summed
over a run, which k and gold set it takes, whether higher is better and how tables show it (ranx's habit: one
definition per metric, named by the definition, never by a bare string).

The code names a metric by `Metric`, a `StrEnum` whose members carry their definition (`Metric.RECALL.spec`; its
docstring is the formula).
A member *is* its saved name: summary.json's `metric` field, scaling.json, routing.json and the viewer's data
hold the same strings they always did. The tokens of an architecture's calls are an open family (a plugin names
its own calls): `tokens_metric(call, kind)`, typed `TokenMetric`, defined by `TOKENS_OF_CALL`.

Notation: G is a query's gold set (`api_list` or `relevant`, `results.schema.GOLDS`), R the architecture's ranked
list cut to k (deduplicated, `ArchBlock.unique_retrieved`), k the budget (the planner's `[retrieval] k`, or each k
of the ablation `ks`), S the APIs the planner selected (`PlanBlock.unique_selected`), T the planner's offer (the
architecture's top k). A metric observed per query is `(num, den)`; its per-run value is sum(num) / sum(den)
over the run's queries (`Aggregate`), then mean±std over runs (`analysis.stats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import NewType

from evaluator.results.schema import FAILURE_KINDS


class AtK(Enum):
    """Which k a metric is computed at (its key's `k`)."""

    NONE = "none"  # no k: the key's k is null
    MAIN = "main"  # the planner's budget only ([retrieval] k)
    EACH = "each"  # every k of the ablation ([retrieval] ks, the planner's k included)


class Aggregate(Enum):
    """How a run's value is made from its queries' observations."""

    MEAN = "mean"  # the mean over the queries observed (den = 1 each)
    POOLED = "pooled"  # a ratio pooled over its own units: sum(num) / sum(den) (stubs, not queries)
    SUM = "sum"  # a count: sum(num)
    DERIVED = "derived"  # made by `analysis.stats` from a run's records or the run-averaged values, not per query


@dataclass(frozen=True)
class Spec:
    """One metric's definition."""

    label: str  # how the report's tables name it
    counts: str  # what it counts, with its formula (the notation of this module's docstring)
    k: AtK
    gold: bool = False  # one value per gold set (the key's gold), else the key's gold is null
    aggregate: Aggregate = Aggregate.MEAN
    higher_is_better: bool | None = None  # None: descriptive, no better direction (tables bold no best)
    rank: bool = False  # a rank metric of the IR literature, defined on a ranked list (`metrics.rank_metrics`)
    # pure retrieval, no LLM: RtP's value is one deterministic value per query, kept once with model null
    retrieval: bool = False
    paired: bool = False  # the paper's paired per-query tests (Wilcoxon) and t-tests run on it (`stats`)
    nway: bool = False  # the N-way comparison of architectures (`analysis.compare`) pairs it, at the main k
    digits: int = 3  # decimals shown
    pct: bool = False  # shown as a percentage (`51.2%`)


def _fault(label: str, counts: str) -> Spec:
    """A count of something that went wrong (per block, no k, no gold): fewer is better."""
    return Spec(label, counts, AtK.NONE, aggregate=Aggregate.SUM, higher_is_better=False)


class Metric(StrEnum):
    """Every metric by its saved name; `.spec` is its definition."""

    spec: Spec

    def __new__(cls, name: str, spec: Spec) -> Metric:
        member = str.__new__(cls, name)
        member._value_ = name
        member.spec = spec
        member.__doc__ = f"{spec.label}: {spec.counts}."  # the member's docstring is its formula (help(), an IDE)
        return member

    # ---- retrieval: any architecture's ranked list against the gold set, at every k
    RECALL = "recall", Spec(
        "Recall", "recall@k = |R ∩ G| / |G|", AtK.EACH, gold=True, higher_is_better=True, retrieval=True,
        paired=True, nway=True)
    PRECISION = "precision", Spec(
        "Precision", "precision@k = |R ∩ G| / k (k nominal, as in the paper, however short R is)", AtK.EACH,
        gold=True, higher_is_better=True, retrieval=True, paired=True, nway=True)
    MISS = "miss", Spec(
        "Complete miss", "complete miss@k = 1 if R ∩ G = ∅, else 0", AtK.EACH, gold=True, higher_is_better=False,
        retrieval=True, digits=1, pct=True)
    NDCG = "ndcg", Spec(
        "NDCG", "NDCG@k = DCG@k / IDCG@k, DCG@k = Σ_{i ≤ k, R_i ∈ G} gain(R_i) / log2(i + 1), IDCG@k the DCG of "
        "the min(|G|, k) gold items of the highest gains on top; gain = the item's grade (graded relevance, "
        "linear as trec_eval's default), 1 for every gold item without grades (binary relevance; trec_eval's "
        "ndcg_cut)", AtK.EACH, gold=True, higher_is_better=True, rank=True,
        retrieval=True, nway=True)
    MRR = "mrr", Spec(
        "MRR", "MRR@k = 1 / rank of the first gold item within the top k, 0 if none (trec_eval's recip_rank on R)",
        AtK.EACH, gold=True, higher_is_better=True, rank=True, retrieval=True, nway=True)
    COMP = "comp", Spec(
        "COMP", "COMP@k = 1 if G ⊆ R, else 0 (COLT's completeness; 0 whenever |G| > k)", AtK.EACH, gold=True,
        higher_is_better=True, rank=True, retrieval=True, nway=True)

    # ---- the planner, shown T (the architecture's top k), at the main k
    PASS = "pass", Spec(
        "Pass rate", "pass = 1 if the planner selected at least one API of T (a made-up name is no selection), "
        "else 0", AtK.MAIN, higher_is_better=True, paired=True, nway=True)
    SELECTION_RATE = "selection_rate", Spec(
        "Selection rate", "selection rate = |S ∩ T| / |T| (queries with T ≠ ∅)", AtK.MAIN, digits=1, pct=True)
    FIDELITY = "fidelity", Spec(
        "Fidelity", "fidelity = |S ∩ T| / |S| (queries with a selection)", AtK.MAIN, higher_is_better=True,
        digits=1, pct=True)
    PLAN_STEPS = "plan_steps", Spec("Plan steps", "the plan's steps", AtK.MAIN, digits=2)
    APIS_NAMED = "apis_named", Spec("APIs named", "|S|: the distinct APIs the planner selected", AtK.MAIN,
                                    digits=2)
    MISS_WRONG_TOOL = "miss_wrong_tool", Spec(
        "On miss: wrong tool", "on a complete miss (T ∩ G = ∅): 1 if the planner still selected something, "
        "else 0", AtK.MAIN, gold=True, digits=1, pct=True)
    MISS_REFUSED = "miss_refused", Spec(
        "On miss: refused", "on a complete miss (T ∩ G = ∅): 1 if the planner refused (`PlanBlock.refused`), "
        "else 0 (a parse error is neither)", AtK.MAIN, gold=True, digits=1, pct=True)

    # ---- tokens (the per-call family: TOKENS_OF_CALL)
    TOKENS_TOTAL = "tokens_total", Spec(
        "Tokens/query", "Σ prompt + completion tokens over every call of the architecture on the query (cached "
        "replies included)", AtK.MAIN, higher_is_better=False, digits=0)
    TOKENS = "tokens", Spec(
        "Tokens/query", "a routing policy's tokens per query: every call of the architecture each query is sent to "
        "(`ArchBlock.total_tokens`; routing.json's name)", AtK.MAIN, higher_is_better=False, digits=0)

    # ---- stubs: an architecture whose block keeps stubs (PtR, hyde)
    GEN = "gen", Spec("Gen.%", "Gen% = 1 if discovery produced at least one stub, else 0", AtK.NONE,
                      higher_is_better=True, digits=1, pct=True)
    STUBS_PER_QUERY = "stubs_per_query", Spec("Stubs/q", "the stubs discovery produced", AtK.NONE, digits=2)
    STUB_UNIQUE = "stub_unique", Spec(
        "Unique%", "Unique% = distinct stub names / all stub names, over a run's queries", AtK.NONE,
        aggregate=Aggregate.DERIVED, digits=1, pct=True)
    STUB_MATCH = "stub_match", Spec(
        "Match%", "Match% = stubs whose top-1 API is in G / stubs that retrieved anything (pooled over stubs; a "
        "stub copying the prompt's example left out)", AtK.NONE, gold=True, aggregate=Aggregate.POOLED,
        higher_is_better=True, digits=1, pct=True)
    STUB_COS_CORRECT = "stub_cos_correct", Spec(
        "Cos (correct)", "the mean score (cosine, dense) of a stub to its top-1 API, over stubs whose top-1 is in G "
        "(pooled over stubs)", AtK.NONE, gold=True, aggregate=Aggregate.POOLED)
    STUB_COS_INCORRECT = "stub_cos_incorrect", Spec(
        "Cos (incorrect)", "the mean score of a stub to its top-1 API, over stubs whose top-1 is not in G (pooled "
        "over stubs)", AtK.NONE, gold=True, aggregate=Aggregate.POOLED)
    WIDTH = "width", Spec(
        "Effective width", "effective search width@k = |∪ per-stub top-k lists|, deduplicated, before the cut to k",
        AtK.EACH, digits=1)

    # ---- counts: summed over a run's queries
    N_QUERIES = "n_queries", Spec("records", "the architecture's records (blocks)", AtK.NONE,
                                  aggregate=Aggregate.SUM)
    PLANNER_PARSE_ERROR = "planner_parse_error", _fault("planner parse errors", "planner replies that did not parse")
    PLANNER_LLM_ERROR = "planner_llm_error", _fault("planner LLM errors", "planner calls that failed for good")
    PLANNER_TRUNCATED = "planner_truncated", _fault("planner truncated",
                                                    "planner replies cut at max_tokens (finish_reason length)")
    DISCOVERY_PARSE_ERROR = "discovery_parse_error", _fault("discovery parse errors",
                                                            "discovery replies that did not parse")
    DISCOVERY_LLM_ERROR = "discovery_llm_error", _fault("discovery LLM errors", "discovery calls that failed for good")
    DISCOVERY_TRUNCATED = "discovery_truncated", _fault("discovery truncated",
                                                        "discovery replies cut at max_tokens (finish_reason length)")
    FALLBACK = "fallback", Spec(
        "fallbacks (raw query)", "queries with no stub that searched with the raw query ([retrieval] "
        "fallback_to_query)", AtK.NONE, aggregate=Aggregate.SUM)
    OWN_CALL_ERROR = "own_call_error", _fault(
        "own-call LLM errors", "blocks whose own call (not the planner) failed for good (`ArchBlock.errors`): not "
        "scored")
    # the architecture itself failed on the query (`ArchBlock.failure`), one count per kind (schema.FAILURE_KINDS)
    FAILED_ARCH_ERROR = "failed_arch_error", _fault("failed: arch_error", "blocks whose architecture raised")
    FAILED_CONTRACT = "failed_contract", _fault("failed: contract",
                                                "blocks whose architecture broke the plugin contract")
    FAILED_TIMEOUT = "failed_timeout", _fault("failed: timeout",
                                              "blocks whose architecture ran past [run] arch_timeout_s")
    FAILED_CYCLE = "failed_cycle", _fault("failed: cycle", "blocks whose architecture waited on its own outcome")

    # ---- RtP against PtR (architecture "both")
    DIVERGENT = "divergent", Spec(
        "Divergent", "1 if RtP's and PtR's top-k sets differ, else 0", AtK.EACH, digits=1, pct=True)
    DISJOINT = "disjoint", Spec(
        "Disjoint", "1 if RtP's and PtR's top-k sets share nothing, else 0 (the scaling study, the paper's 3.2 "
        "wording)", AtK.MAIN, digits=1, pct=True)
    RECALL_WIN_RTP = "recall_win_rtp", Spec(
        "RtP recall wins", "per run: 1 if RtP's recall@k is higher than PtR's, else 0", AtK.EACH, gold=True)
    RECALL_WIN_PTR = "recall_win_ptr", Spec(
        "PtR recall wins", "per run: 1 if PtR's recall@k is higher than RtP's, else 0", AtK.EACH, gold=True)
    RECALL_TIE = "recall_tie", Spec(
        "recall ties", "per run: 1 if RtP's and PtR's recall@k are equal, else 0", AtK.EACH, gold=True)
    WINS = "wins", Spec(
        "wins", "queries whose run-averaged recall@k is higher for this architecture (RtP or PtR) than for the "
        "other (ties on true equality, `stats.TIE_TOLERANCE`)", AtK.EACH, gold=True, aggregate=Aggregate.DERIVED,
        digits=0)
    TIES = "ties", Spec(
        "ties", "paired queries whose run-averaged recall@k is equal for RtP and PtR", AtK.EACH, gold=True,
        aggregate=Aggregate.DERIVED, digits=0)
    JACCARD_SELECTED = "jaccard_selected", Spec(
        "Jaccard (selected)", "|S_RtP ∩ S_PtR| / |S_RtP ∪ S_PtR|, 1 when both are empty", AtK.MAIN, digits=2)
    BOTH_REFUSED = "both_refused", Spec(
        "Both refused", "1 if neither planner selected anything (S_RtP = S_PtR = ∅), else 0", AtK.MAIN, digits=1,
        pct=True)

    @classmethod
    def named(cls, name: str) -> Metric:
        """The metric saved as `name` (a file's `metric` field); KeyError for a name no metric has."""
        return _BY_NAME[name]

    @classmethod
    def failed(cls, kind: str) -> Metric:
        """The count of blocks whose architecture failed with `kind` (one of `schema.FAILURE_KINDS`)."""
        return FAILED[kind]


_BY_NAME: dict[str, Metric] = {m.value: m for m in Metric}
# A failure kind without its count stops the import here, not in a report.
FAILED: dict[str, Metric] = {kind: _BY_NAME[f"failed_{kind}"] for kind in FAILURE_KINDS}

TokenMetric = NewType("TokenMetric", str)
# A metric's name in a key or a row: a member of Metric or one of the tokens-per-call family.
MetricName = Metric | TokenMetric

TOKENS_OF_CALL = Spec(
    "tokens", "tokens_{call}_{kind}: the prompt or completion tokens of the architecture's call `call` (planner, "
    "discovery, hyde, rewrite, a plugin's own) on the query", AtK.MAIN, higher_is_better=False, digits=0)
TOKEN_KINDS = ("prompt", "completion")


def tokens_metric(call: str, kind: str) -> TokenMetric:
    """The tokens of one kind (`TOKEN_KINDS`) of one call of an architecture (`TOKENS_OF_CALL`)."""
    return TokenMetric(f"tokens_{call}_{kind}")


def spec(metric: MetricName) -> Spec:
    """Any metric's definition, the per-call token family's included."""
    return metric.spec if isinstance(metric, Metric) else TOKENS_OF_CALL


# The groups the analyses read, each derived from the definitions above.
RETRIEVAL_METRICS = frozenset(m for m in Metric if m.spec.retrieval)
RANK_METRICS: tuple[Metric, ...] = tuple(m for m in Metric if m.spec.rank)
COUNT_METRICS = frozenset(m for m in Metric if m.spec.aggregate is Aggregate.SUM)
PAIRED_METRICS = frozenset(m for m in Metric if m.spec.paired)
NWAY_METRICS: tuple[Metric, ...] = tuple(m for m in Metric if m.spec.nway)
