"""Durable record of submitted batches (SQLite under `<cache_root>/batch/jobs.sqlite`).

A batch costs money once created, so its existence is written down before it can be lost: the row
(with a fresh token and the request keys) is committed *before* the create call, the provider's batch
id right after it returns. A command killed in between finds the row without an id and looks the batch up
at the provider by its token (sent as batch metadata / display name) instead of creating it again.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson

from evaluator.core.cache_layout import CacheLayout

OPEN = ("pending", "submitted")  # states whose requests may still come back from the provider


@dataclass
class Job:
    token: str
    profile: str
    provider: str
    batch_id: str | None
    keys: list[str]
    state: str  # pending | submitted | done | cancelled | lost
    created: float
    attempt: int = 1  # 1 for a first submission, 2+ for re-submissions of failed or expired requests


class JobStore:
    def __init__(self, cache_root: Path | str) -> None:
        path = CacheLayout(cache_root).batch
        path.mkdir(parents=True, exist_ok=True)
        self.path = path / "jobs.sqlite"
        # isolation_level=None: autocommit, so every write below is committed when the call returns.
        self._db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS jobs (token TEXT PRIMARY KEY, profile TEXT, provider TEXT, batch_id TEXT,"
            " keys BLOB, state TEXT, created REAL, attempt INTEGER)"
        )
        # Which model an exported request belongs to, so `requests import` needs no --model.
        self._db.execute("CREATE TABLE IF NOT EXISTS exported (key TEXT PRIMARY KEY, profile TEXT)")

    def close(self) -> None:
        self._db.close()

    def new(self, profile: str, provider: str, keys: list[str], attempt: int = 1) -> Job:
        job = Job(uuid.uuid4().hex, profile, provider, None, keys, "pending", time.time(), attempt)
        self._db.execute(
            "INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (job.token, profile, provider, None, orjson.dumps(keys), job.state, job.created, attempt),
        )
        return job

    def submitted(self, job: Job, batch_id: str) -> None:
        job.batch_id, job.state = batch_id, "submitted"
        self._db.execute("UPDATE jobs SET batch_id = ?, state = ? WHERE token = ?", (batch_id, job.state, job.token))

    def mark(self, job: Job, state: str) -> None:
        job.state = state
        self._db.execute("UPDATE jobs SET state = ? WHERE token = ?", (state, job.token))

    def jobs(self, profile: str, states: tuple[str, ...] | None = None) -> list[Job]:
        rows = self._db.execute(
            "SELECT token, profile, provider, batch_id, keys, state, created, attempt FROM jobs WHERE profile = ? ORDER BY created",
            (profile,),
        ).fetchall()
        jobs = [Job(t, p, pr, b, orjson.loads(k), s, c, a) for t, p, pr, b, k, s, c, a in rows]
        return [j for j in jobs if states is None or j.state in states]

    def open_jobs(self, profile: str) -> list[Job]:
        return self.jobs(profile, OPEN)

    def remember_export(self, profile: str, keys: list[str]) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO exported VALUES (?, ?)", [(k, profile) for k in keys])

    def exported_profile(self, key: str) -> str | None:
        row = self._db.execute("SELECT profile FROM exported WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None
