"""A finished run's ranked lists and gold sets as TREC files, for trec_eval, pytrec_eval, ranx, ir-measures.

- One run file per (model, run, architecture, retriever): `qid Q0 docid rank score tag`, one line per retrieved
  API (best first, ranks from 1, the record's top K_MAX), tag = the file's stem.
- One qrels file per gold set (`qrels.<gold>.txt`): `qid 0 docid grade` per gold API, the grade its relevance
  (a BEIR folder's qrels score, > 0; 1 for binary gold), so trec_eval's graded NDCG is the report's.
- qid = `<subset>/<query_id>` (`bare`: the query id alone, as a BEIR folder's own qrels name it; the caller
  checks no two subsets share one: `shared_qids`), docid = the API id; whitespace and `%` in either are
  percent-encoded (UTF-8 bytes, so `urllib.parse.unquote` gives the id back): TREC files are whitespace-separated.
- score = the record's score (the retriever's: cosine, BM25 or RRF, 6 decimals). Tools re-sort a run by score
  and break ties by docid, and trec_eval (pytrec_eval) reads scores in single precision, so a score that is
  not below the previous one by a millionth of its size (16 single-precision steps) is lowered to that:
  every tool then reads the list in the record's order, and scores move only where the record has ties.
- A query that retrieved nothing (a PtR query with no stub) has no line; its metrics are 0, as in the report,
  when the tool averages over every query of the qrels (`trec_eval -c`). A PtR query whose discovery call
  failed for good is left out of the report's PtR metrics: its qid is listed in `<run>.excluded` instead.
Pure: records in, {file name: text} out (the caller writes them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from evaluator.results.schema import GOLDS, Record
from evaluator.results.stream import in_key_order

_ESCAPE = re.compile(r"[%\s]")
_NAME = re.compile(r"[^A-Za-z0-9._+-]+")
TIE_STEP = 1e-6  # relative: above float32's resolution (6e-8) with room to spare


def encode(text: str) -> str:
    """Whitespace and `%` percent-encoded: one TREC field, reversible with urllib.parse.unquote."""
    return _ESCAPE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode("utf-8")), text)


def qid(subset: str, query_id: object, bare: bool = False) -> str:
    return encode(str(query_id) if bare else f"{subset}/{query_id}")


class SharedQid(NamedTuple):
    query_id: str
    subset: str  # the first subset it is in
    other: str  # another


def shared_qids(records: Iterable[Record]) -> SharedQid | None:
    """A query id two subsets share, which bare qids could not tell apart; None if none."""
    first: dict[str, str] = {}
    for r in records:
        q = str(r.query_id)
        if first.setdefault(q, r.subset) != r.subset:
            return SharedQid(q, first[q], r.subset)
    return None


def run_name(model: str | None, run: int, arch: str, retriever: str) -> str:
    """The file stem and tag of one run file: `<model>.run<r>.<arch>.<retriever>` (model `retrieval` when none)."""
    return _NAME.sub("_", f"{model or 'retrieval'}.run{run}.{arch}.{retriever}")


def strictly_decreasing(scores: Sequence[float]) -> list[float]:
    out: list[float] = []
    for s in scores:
        if out:
            cap = out[-1] - max(abs(out[-1]), 1e-3) * TIE_STEP
            s = min(s, cap)
        out.append(s)
    return out


def run_lines(records: Iterable[Record], arch: str, tag: str, bare: bool = False) -> tuple[list[str], list[str]]:
    """(lines of the run file, qids left out because the architecture's discovery failed)."""
    lines: list[str] = []
    excluded: list[str] = []
    for r in records:
        block = r.block(arch)
        if block is None:
            continue
        q = qid(r.subset, r.query_id, bare)
        if getattr(block, "excluded", False):
            excluded.append(q)
            continue
        seen: set[str] = set()
        ids, scores = [], []
        for i, doc in enumerate(block.retrieved):
            if doc is None or doc in seen:
                continue  # the metrics read the de-duplicated list (ArchBlock.unique_retrieved)
            seen.add(doc)
            ids.append(doc)
            scores.append(float(block.scores[i]) if i < len(block.scores) else 0.0)
        for rank, (doc, s) in enumerate(zip(ids, strictly_decreasing(scores), strict=True), 1):
            lines.append(f"{q} Q0 {encode(doc)} {rank} {s:.10g} {tag}")
    return lines, excluded


def qrels_lines(records: Iterable[Record], gold: str, bare: bool = False) -> list[str]:
    lines: list[str] = []
    seen: set[tuple[str, object]] = set()
    for r in records:
        if (r.subset, r.query_id) in seen:
            continue
        seen.add((r.subset, r.query_id))
        q = qid(r.subset, r.query_id, bare)
        lines += [f"{q} 0 {encode(doc)} {r.grade(doc)}" for doc in dict.fromkeys(r.gold_set(gold))]
    return lines


def export(records: Sequence[Record], bare: bool = False) -> dict[str, str]:
    """Every run file and qrels file of these records, by file name (`bare`: qids without their subset)."""
    recs = in_key_order(records)
    groups: dict[tuple[str | None, int, str, str], list[Record]] = {}
    for r in recs:
        for arch in r.arch_names:  # every architecture of the study (Record.archs, in --archs order)
            if r.block(arch) is not None:
                groups.setdefault((r.model, r.run, arch, r.retriever_name), []).append(r)
    files: dict[str, str] = {}
    for (model, run, arch, retriever), rs in groups.items():
        name = run_name(model, run, arch, retriever)
        lines, excluded = run_lines(rs, arch, name, bare)
        files[f"{name}.trec"] = "".join(line + "\n" for line in lines)
        if excluded:
            files[f"{name}.excluded"] = "".join(q + "\n" for q in excluded)
    for gold in GOLDS:
        lines = qrels_lines(recs, gold, bare)
        if lines:
            files[f"qrels.{gold}.txt"] = "".join(line + "\n" for line in lines)
    return files
