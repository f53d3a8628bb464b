"""A small BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv, graded) that tests build themselves."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

DOCS = [
    {"_id": "d1", "title": "weather_forecast", "text": "Daily weather forecast for a city."},
    {"_id": "d2", "title": "weather_history", "text": " Past weather observations of a city. "},
    {"_id": "d3", "title": "", "text": "Convert an amount between two currencies."},
    {"_id": "d4", "text": "Latest price of a stock ticker."},  # no title: BEIR embeds the text alone
    {"_id": "d5", "title": "send_email", "text": "Send an email to a recipient."},
    {"_id": 6, "title": "calendar_add", "text": "Add an event to a calendar."},  # an integer id reads as "6"
]
QUERIES = [
    {"_id": "q1", "text": "Will it rain in Paris tomorrow?", "metadata": {"subset": "weather"}},
    {"_id": "q2", "text": "How many euros is 100 dollars?", "metadata": {"subset": "money"}},
    {"_id": "q3", "text": "Email my boss and add the meeting to my calendar.", "metadata": {"subset": "office"}},
    {"_id": "q4", "text": "What is the Apple stock price?", "metadata": {"subset": "money"}},  # only score 0
    {"_id": "q5", "text": "Was last winter cold in Oslo?", "metadata": {"subset": "weather"}},  # judged in dev only
]
TEST_QRELS = [("q1", "d1", 2), ("q1", "d2", 1), ("q2", "d3", 1), ("q2", "d4", 0), ("q3", "d5", 3), ("q3", "6", 1),
              ("q3", "6", 1), ("q4", "d4", 0)]  # q3/6 twice (the same score): counted once
DEV_QRELS = [("q5", "d2", 1)]


def jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def tsv(rows: list[tuple[str, str, int]]) -> str:
    return "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in rows)


def beir_folder(root: Path, *, docs: list[dict] = DOCS, queries: list[dict] = QUERIES,
                test: str | None = None, gz: bool = False) -> Path:
    """A small BEIR folder; `gz`: corpus and qrels gzipped."""
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    files = {"corpus.jsonl": jsonl(docs), "queries.jsonl": jsonl(queries),
             "qrels/test.tsv": tsv(TEST_QRELS) if test is None else test, "qrels/dev.tsv": tsv(DEV_QRELS)}
    for name, text in files.items():
        if gz and name != "queries.jsonl":
            (root / f"{name}.gz").write_bytes(gzip.compress(text.encode()))
        else:
            (root / name).write_text(text, encoding="utf-8")
    return root


def write_qrels(folder: Path, rows: list[tuple[str, str, int]]) -> None:
    (folder / "qrels" / "test.tsv").write_text(tsv(rows), encoding="utf-8")


