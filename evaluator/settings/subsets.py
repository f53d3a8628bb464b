"""The subsets each analysis uses, from the [analysis] section and the subsets a study has."""

from __future__ import annotations

from pydantic.dataclasses import dataclass

from evaluator import data
from evaluator.core.errors import ConfigError
from evaluator.settings.sections import AnalysisSettings


def match_subsets(available: list[str], wanted: list[str], what: str) -> list[str]:
    """`wanted` holds subset names or prefixes, as on the run's CLI (`data.match_subsets`, the one rule)."""
    return data.match_subsets(available, wanted, lambda w: ConfigError(
        f"{what}: subset {w!r} is not in this run; it has {', '.join(available) or 'none'}."))


@dataclass
class AnalysisSubsets:
    routing_train: list[str]
    routing_test: list[str]
    scaling: list[str]
    divergence: str


def analysis_subsets(a: AnalysisSettings, available: list[str]) -> AnalysisSubsets:
    """The subsets each analysis uses, as full names. Rule for what is not set: subsets in sorted
    order; routing's held-out test set is the last one and the others tune τ (none with one subset);
    scaling uses every subset but that last one (all of them when there are fewer than three);
    Div% is reported for the first scaling subset. On ToolBench's G1/G2/G3 this is the paper's
    choice: G1+G2 → G3, scaling on G1 and G2."""
    subs = sorted(available)
    test = match_subsets(subs, list(a.routing_test), "analysis routing_test") if a.routing_test else subs[-1:]
    if a.routing_train:
        train = match_subsets(subs, list(a.routing_train), "analysis routing_train")
    else:
        train = [x for x in subs if x not in test]
    if len(subs) < 2 and not a.routing_test:
        train, test = [], []
    scaling = (match_subsets(subs, list(a.scaling_subsets), "analysis scaling_subsets") if a.scaling_subsets
               else subs[:-1] if len(subs) >= 3 else subs)
    if a.divergence_subset:
        div = match_subsets(subs, [a.divergence_subset], "analysis divergence_subset")[0]
    else:
        div = scaling[0] if scaling else ""
    return AnalysisSubsets(train, test, scaling, div)
