"""Durable response cache for chat calls (diskcache/SQLite under `<cache_root>/llm/`), and the
in-flight claims that keep two processes sharing it from paying for the same call twice.

Key: sha256 over the canonical JSON (sorted keys) of what determines a reply: endpoint base URL,
model id, every sampling parameter (temperature, max_tokens, extra_body), the run index (sent as the
seed, so 4 runs are 4 samples) and the prompt version, then the messages, then — only when one is
sent — the `response_format`. Transport settings (timeouts, concurrency, retries, limits) and the API
key are never part of it. The key is that of the *logical* request: when a host rejects a field
(`seed`, `response_format`) and the engine stops sending it, the key stays the same, so a resume finds
what the first run stored (the entry records what was dropped). Keyed on the wire body instead, a
resumed run would look up the keys with `seed`, miss every reply stored without it and buy them again.

`set` returns after SQLite committed the row (WAL mode), so a reply survives SIGKILL of the process
the moment it is stored; SQLite's locking makes one cache safe to share between processes.

Claims live in a second small diskcache (`llm/claims/`): `add(key, owner, expire=lease)` is atomic, so
exactly one process owns a call at a time; the owner renews its lease while the call runs and deletes
the claim after the reply is stored. A claim whose owner died (its pid is gone on this host) or whose
lease ran out can be taken over.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sqlite3
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import diskcache
import orjson

from .errors import ConfigError, FatalLLMError

KEY_SCHEMA = 1  # bump if the key recipe changes, so old entries are never misread
_SORT = orjson.OPT_SORT_KEYS
_HOST = socket.gethostname()


def cache_dir(root: Path | str) -> Path:
    return Path(root) / "llm"


def key_prefix(base_url: str, model: str, sampling: dict[str, Any]) -> hashlib._Hash:
    """The hash state of a model's fixed key part; `call_key` copies it per call (cheap)."""
    fixed = {"schema": KEY_SCHEMA, "endpoint": base_url.rstrip("/"), "model": model, "sampling": sampling}
    h = hashlib.sha256(orjson.dumps(fixed, option=_SORT))
    h.update(b"\n")
    return h


def call_key(
    prefix: hashlib._Hash,
    messages: list[dict[str, Any]],
    run: int,
    prompt_version: str,
    response_format: dict[str, Any] | None = None,
) -> str:
    h = prefix.copy()
    h.update(orjson.dumps([run, prompt_version, messages], option=_SORT))
    if response_format is not None:  # appended only when sent: keys of free-text calls are unchanged
        h.update(b"\nresponse_format\n" + orjson.dumps(response_format, option=_SORT))
    return h.hexdigest()


def body_key(endpoint: str, body: dict[str, Any]) -> str:
    """Key of an arbitrary chat-completions body (request files): endpoint + the canonical body."""
    fixed = {"schema": KEY_SCHEMA, "endpoint": endpoint.rstrip("/"), "body": body}
    return "body-" + hashlib.sha256(orjson.dumps(fixed, option=_SORT)).hexdigest()


def new_owner() -> str:
    """A claim owner id: host, pid (to tell a dead owner on this host) and a random part."""
    return f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def _owner_dead(owner: Any) -> bool:
    try:
        host, pid, _ = str(owner).split(":", 2)
        if host != _HOST:
            return False  # cannot tell from here; its lease will run out
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (ValueError, PermissionError, OSError):
        return False
    return False


def _not_writable(path: Path, e: BaseException) -> str:
    return f"cache dir {path.parent} is not writable; use --cache-dir ({type(e).__name__}: {e})"


class ResponseCache:
    """Stored replies as orjson bytes, tagged with the profile name so `clear --model` can find them.

    Opening checks that the cache can be written (a read-only folder or database, or a path that is
    a file, is a `ConfigError` with one line, before any paid work).
    """

    def __init__(self, root: Path | str) -> None:
        self.path = cache_dir(root)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            # eviction off: an evicted reply would be silently re-bought and break exact resume.
            self._db = diskcache.Cache(str(self.path), eviction_policy="none", statistics=0)
            # Claims need not survive a power cut (a lost claim only costs a duplicate), so no fsync.
            self._claims = diskcache.Cache(
                str(self.path / "claims"), eviction_policy="none", statistics=0, sqlite_synchronous=0
            )
            with self._db.transact(retry=True):  # BEGIN IMMEDIATE: fails now on a read-only database
                pass
            with self._claims.transact(retry=True):
                pass
        except (OSError, sqlite3.Error) as e:
            raise ConfigError(_not_writable(self.path, e)) from None

    # -- replies ---------------------------------------------------------------------------------
    def get(self, key: str) -> dict[str, Any] | None:
        raw = self._db.get(key)
        return None if raw is None else orjson.loads(raw)

    def set(self, key: str, value: dict[str, Any], tag: str) -> None:
        try:
            self._db.set(key, orjson.dumps(value), tag=tag, retry=True)
        except (OSError, sqlite3.Error) as e:  # e.g. the folder was made read-only mid-run
            raise FatalLLMError(_not_writable(self.path, e)) from None

    def __len__(self) -> int:
        return len(self._db)

    # -- claims ----------------------------------------------------------------------------------
    def claim(self, key: str, owner: str, lease_s: float) -> bool:
        """Take the in-flight claim on `key`; False while another live owner holds it."""
        try:
            if self._claims.add(key, owner, expire=lease_s, retry=True):
                return True
            with self._claims.transact(retry=True):
                holder = self._claims.get(key)
                if holder is None or holder == owner or _owner_dead(holder):
                    self._claims.set(key, owner, expire=lease_s, retry=True)
                    return True
        except (OSError, sqlite3.Error) as e:
            raise FatalLLMError(_not_writable(self.path, e)) from None
        return False

    def held_elsewhere(self, key: str, owner: str) -> bool:
        holder = self._claims.get(key)
        return holder is not None and holder != owner and not _owner_dead(holder)

    def renew(self, keys: Iterable[str], owner: str, lease_s: float) -> None:
        with self._claims.transact(retry=True):
            for key in keys:
                if self._claims.get(key) in (owner, None):
                    self._claims.set(key, owner, expire=lease_s, retry=True)

    def release(self, keys: Iterable[str], owner: str) -> None:
        with self._claims.transact(retry=True):
            for key in keys:
                if self._claims.get(key) == owner:
                    self._claims.delete(key, retry=True)

    def close(self) -> None:
        self._db.close()
        self._claims.close()


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
