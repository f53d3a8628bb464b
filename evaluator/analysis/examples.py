"""Worked examples picked from the run's own records by stated rules (paper Tables 2 and 9).

Table 2 (`contrasts`): in run 0 of a model, at the main k and gold `api_list`,
- "RtP wins": RtP's recall is higher than PtR's and the query holds a proper noun (a capitalised word
  that does not open a sentence) that no stub name or reasoning contains — the name was lost in a
  generic stub;
- "PtR wins": PtR's recall is higher than RtP's.
Each side lists up to `n` queries, largest recall difference first, then by subset and query id.

Table 9 (`trajectory`): in run 0 of a model, the first query (by subset, query id) where both planners
answered, both selected at least one API and their selections differ; failing that, the first where
both planners answered.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

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


def contrasts(records: Sequence[Record], model: str, k: int, n: int = 3) -> Contrasts:
    rtp_side: list[tuple[float, Contrast]] = []
    ptr_side: list[tuple[float, Contrast]] = []
    for r in records:
        if r.model != model or r.run != 0 or r.rtp is None or r.ptr is None or r.ptr.excluded:
            continue
        gold = set(r.gold_set("api_list"))
        if not gold:
            continue
        a, b = recall(r.rtp.top(k), gold), recall(r.ptr.top(k), gold)
        stubs = [s.name for s in r.ptr.stubs]
        c = Contrast(r.subset, r.query_id, r.query, a, b, stubs)
        if a > b:
            stub_text = _norm(" ".join(f"{s.name} {s.reasoning}" for s in r.ptr.stubs))
            c.lost_nouns = [w for w in proper_nouns(r.query) if _norm(w) not in stub_text]
            if c.lost_nouns:
                rtp_side.append((a - b, c))
        elif b > a:
            ptr_side.append((b - a, c))

    def best(side: list[tuple[float, Contrast]]) -> list[Contrast]:
        side.sort(key=lambda dc: (-dc[0], dc[1].subset, qid_key(dc[1].query_id)))
        return [c for _, c in side[:n]]

    return Contrasts(model, best(rtp_side), best(ptr_side))


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


def trajectory(records: Sequence[Record], model: str, k: int) -> Trajectory | None:
    both: list[Record] = []
    for r in sorted(records, key=lambda r: (r.subset, qid_key(r.query_id))):
        if r.model == model and r.run == 0 and r.rtp is not None and r.rtp.plan_usable \
                and isinstance(r.ptr, PtrBlock) and r.ptr.plan_usable and not r.ptr.excluded:
            both.append(r)
    if not both:
        return None

    def differs(r: Record) -> bool:
        assert r.rtp and r.rtp.plan and r.ptr and r.ptr.plan
        a, b = r.rtp.plan.unique_selected, r.ptr.plan.unique_selected
        return bool(a) and bool(b) and set(a) != set(b)

    r = next((x for x in both if differs(x)), both[0])
    assert r.rtp and r.rtp.plan and r.ptr and r.ptr.plan
    return Trajectory(model, r.subset, r.query_id, r.query, k, r.rtp.top(k), list(r.rtp.plan.steps),
                      r.rtp.plan.unique_selected, [s.name for s in r.ptr.stubs], r.ptr.top(k),
                      list(r.ptr.plan.steps), r.ptr.plan.unique_selected)
