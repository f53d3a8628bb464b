"""Worked examples picked from the run's own records by stated rules (paper Tables 2 and 9).

Table 2 (`ContrastPicker`): in run 0 of a model, at the main k and gold `api_list`,
- "RtP wins": RtP's recall is higher than PtR's and the query holds a proper noun (a capitalised word
  that does not open a sentence) that no stub name or reasoning contains — the name was lost in a
  generic stub;
- "PtR wins": PtR's recall is higher than RtP's.
Each side lists up to `n` queries, largest recall difference first, then by subset and query id.

Table 9 (`TrajectoryPicker`): in run 0 of a model, the first query (by subset, query id) where both planners
answered, both selected at least one API and their selections differ; failing that, the first where
both planners answered.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from evaluator.analysis.metrics import recall
from evaluator.results.schema import PtrBlock, QueryId, Record, qid_key

CONTRAST_RULE = (
    "run 0, main k, gold `api_list`. *RtP wins*: RtP recall > PtR recall and the query has a proper noun "
    "(a capitalised word that does not open a sentence) that no stub name or reasoning contains. *PtR wins*: "
    "PtR recall > RtP recall. Largest recall difference first, then subset and query id."
)
TRAJECTORY_RULE = (
    "run 0; the first query (by subset, query id) where both planners answered, both selected at least one "
    "API and their selections differ (failing that, the first where both planners answered)."
)

_WORD = re.compile(r"[A-Za-z][\w'’-]*")
_SENTENCE_END = re.compile(r"[.!?:]\s*$")


def proper_nouns(text: str) -> list[str]:
    """Capitalised words that do not open a sentence ("I" excluded), in order, without repeats."""
    out: list[str] = []
    for m in _WORD.finditer(text):
        word = m.group()
        before = text[: m.start()]
        if not word[0].isupper() or word == "I" or not before.strip() or _SENTENCE_END.search(before):
            continue
        if word not in out:
            out.append(word)
    return out


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "", s.lower())


@dataclass
class Contrast:
    subset: str
    query_id: QueryId
    query: str
    rtp_recall: float
    ptr_recall: float
    stubs: list[str]
    lost_nouns: list[str] = field(default_factory=list)  # RtP-win side: proper nouns no stub carries


@dataclass
class Contrasts:
    model: str
    rtp_wins: list[Contrast]
    ptr_wins: list[Contrast]


class ContrastPicker:
    """Table 2's examples of one model, from records given one at a time: each side keeps its `n` best so far
    (at most 4n candidates are held, whatever the number of queries)."""

    def __init__(self, model: str, k: int, n: int = 3) -> None:
        self.model, self.k, self.n = model, k, n
        self.rtp_side: list[tuple[float, Contrast]] = []
        self.ptr_side: list[tuple[float, Contrast]] = []

    def add(self, r: Record) -> None:
        if r.model != self.model or r.run != 0 or r.rtp is None or r.ptr is None or r.ptr.excluded or r.rtp.excluded:
            return
        gold = set(r.gold_set("api_list"))
        if not gold:
            return
        a, b = recall(r.rtp.top(self.k), gold), recall(r.ptr.top(self.k), gold)
        stubs = [s.name for s in r.ptr.stubs]
        c = Contrast(r.subset, r.query_id, r.query, a, b, stubs)
        if a > b:
            stub_text = _norm(" ".join(f"{s.name} {s.reasoning}" for s in r.ptr.stubs))
            c.lost_nouns = [w for w in proper_nouns(r.query) if _norm(w) not in stub_text]
            if c.lost_nouns:
                self._keep(self.rtp_side, a - b, c)
        elif b > a:
            self._keep(self.ptr_side, b - a, c)

    def _keep(self, side: list[tuple[float, Contrast]], delta: float, c: Contrast) -> None:
        side.append((delta, c))
        if len(side) >= 4 * self.n:
            side[:] = self._best(side)

    def _best(self, side: list[tuple[float, Contrast]]) -> list[tuple[float, Contrast]]:
        return sorted(side, key=lambda dc: (-dc[0], dc[1].subset, qid_key(dc[1].query_id)))[: self.n]

    def result(self) -> Contrasts:
        return Contrasts(self.model, [c for _, c in self._best(self.rtp_side)],
                         [c for _, c in self._best(self.ptr_side)])


@dataclass
class Trajectory:
    model: str
    subset: str
    query_id: QueryId
    query: str
    k: int
    rtp_top: list[str]
    rtp_steps: list[str]
    rtp_selected: list[str]
    stubs: list[str]
    ptr_top: list[str]
    ptr_steps: list[str]
    ptr_selected: list[str]


class TrajectoryPicker:
    """Table 9's example of one model, from records given one at a time in any order: the first (by subset,
    query id) record where both planners answered, and the first of those whose selections differ."""

    def __init__(self, model: str, k: int) -> None:
        self.model, self.k = model, k
        self.first: tuple[tuple[str, Any], Record] | None = None
        self.first_differing: tuple[tuple[str, Any], Record] | None = None

    def add(self, r: Record) -> None:
        if not (r.model == self.model and r.run == 0 and r.rtp is not None and r.rtp.plan_usable
                and isinstance(r.ptr, PtrBlock) and r.ptr.plan_usable and not r.ptr.excluded):
            return
        key = (r.subset, qid_key(r.query_id))
        if self.first is None or key < self.first[0]:
            self.first = (key, r)
        if _differs(r) and (self.first_differing is None or key < self.first_differing[0]):
            self.first_differing = (key, r)

    def result(self) -> Trajectory | None:
        got = self.first_differing or self.first
        if got is None:
            return None
        r, k = got[1], self.k
        assert r.rtp and r.rtp.plan and r.ptr and r.ptr.plan
        return Trajectory(self.model, r.subset, r.query_id, r.query, k, r.rtp.top(k), list(r.rtp.plan.steps),
                          r.rtp.plan.unique_selected, [s.name for s in r.ptr.stubs], r.ptr.top(k),
                          list(r.ptr.plan.steps), r.ptr.plan.unique_selected)


def _differs(r: Record) -> bool:
    assert r.rtp and r.rtp.plan and r.ptr and r.ptr.plan
    a, b = r.rtp.plan.unique_selected, r.ptr.plan.unique_selected
    return bool(a) and bool(b) and set(a) != set(b)
