"""Durable response cache for chat calls (diskcache/SQLite under `<cache_root>/llm/`).

Key: sha256 over the canonical JSON (sorted keys) of what determines a reply: endpoint base URL,
model id, every sampling parameter (temperature, max_tokens, extra_body), the run index (sent as the
seed, so 4 runs are 4 samples) and the prompt version, then the messages. Transport settings
(timeouts, concurrency, retries, limits) and the API key are never part of it.

`set` returns after SQLite committed the row (WAL mode), so a reply survives SIGKILL of the process
the moment it is stored; SQLite's locking makes one cache safe to share between processes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import diskcache
import orjson

KEY_SCHEMA = 1  # bump if the key recipe changes, so old entries are never misread
_SORT = orjson.OPT_SORT_KEYS


def cache_dir(root: Path | str) -> Path:
    return Path(root) / "llm"


def key_prefix(base_url: str, model: str, sampling: dict[str, Any]) -> hashlib._Hash:
    """The hash state of a model's fixed key part; `call_key` copies it per call (cheap)."""
    fixed = {"schema": KEY_SCHEMA, "endpoint": base_url.rstrip("/"), "model": model, "sampling": sampling}
    h = hashlib.sha256(orjson.dumps(fixed, option=_SORT))
    h.update(b"\n")
    return h


def call_key(prefix: hashlib._Hash, messages: list[dict[str, Any]], run: int, prompt_version: str) -> str:
    h = prefix.copy()
    h.update(orjson.dumps([run, prompt_version, messages], option=_SORT))
    return h.hexdigest()


class ResponseCache:
    """Stored replies as orjson bytes, tagged with the profile name so `clear --model` can find them."""

    def __init__(self, root: Path | str) -> None:
        self.path = cache_dir(root)
        # eviction off: an evicted reply would be silently re-bought and break exact resume.
        self._db = diskcache.Cache(str(self.path), eviction_policy="none", statistics=0)

    def get(self, key: str) -> dict[str, Any] | None:
        raw = self._db.get(key)
        return None if raw is None else orjson.loads(raw)

    def set(self, key: str, value: dict[str, Any], tag: str) -> None:
        self._db.set(key, orjson.dumps(value), tag=tag, retry=True)

    def __len__(self) -> int:
        return len(self._db)

    def close(self) -> None:
        self._db.close()


def cache_stats(root: Path | str) -> dict[str, Any]:
    """Entries per model (profile name) and bytes on disk, for `python -m evaluator cache stats`."""
    path = cache_dir(root)
    if not (path / "cache.db").exists():
        return {"path": str(path), "entries": 0, "size_bytes": 0, "by_model": {}}
    with diskcache.Cache(str(path)) as db:
        # diskcache has no public group-by; its `Cache` table and `tag` column are stable since 2016.
        rows = db._sql("SELECT tag, COUNT(*) FROM Cache GROUP BY tag").fetchall()
        by_model = {str(tag): n for tag, n in rows}
        return {"path": str(path), "entries": sum(by_model.values()), "size_bytes": db.volume(), "by_model": by_model}


def cache_clear(root: Path | str, model: str | None = None) -> int:
    """Delete all cached replies, or those of one model (profile name); returns how many."""
    path = cache_dir(root)
    if not (path / "cache.db").exists():
        return 0
    with diskcache.Cache(str(path)) as db:
        return db.clear(retry=True) if model is None else db.evict(model, retry=True)
