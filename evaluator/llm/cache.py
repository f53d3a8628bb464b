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

Each stored value is a `CacheEntry` behind a sha256 of its bytes (`ce1:<hex>:<json>`). A value whose
checksum, JSON or fields do not hold (bytes flipped on disk, a row holding other JSON) is a miss: the
call is sent again and stored over it, and `damaged` counts such keys for the run's warning. Values
stored before checksums (plain JSON) are still read, checked for their fields only. A damaged
database file (not SQLite, a corrupt page) is one line naming it, at open (`PRAGMA quick_check`) or
mid-run; it is never used.

A reply cut short is stored with why (`cut`: max_tokens, the server's context, a content filter) and
the server's context size when known (`n_ctx`, from llama.cpp's `/props`); `reusable` is the one rule
deciding whether a later lookup may use it: a reply cut by the server's context is sent again once the
server's context is larger (or cannot be told), one cut by a filter is sent again by a later run.

A database whose pages are damaged is repaired at open: every row that can still be read and whose
checksum holds is kept, the damaged ones are dropped (requested again), the damaged file is kept aside
(`cache.db.damaged-*`), with one warning line.

A full disk (or any I/O error) while storing raises `StoreError`; the engine keeps the replies it
could not store in memory and `spill`s them into a small JSONL file (`spill-*.jsonl` in the cache
folder, else in the system temp folder), which the next open of the same cache imports and deletes.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import sqlite3
import struct
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import diskcache
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evaluator.core.cache_layout import CacheLayout
from evaluator.core.errors import ConfigError, FatalLLMError
from evaluator.core.files import atomic_write
from evaluator.core.redact import scrub
from evaluator.llm.reply import CONTEXT, MAX_TOKENS

KEY_SCHEMA = 1  # bump if the key recipe changes, so old entries are never misread
_SORT = orjson.OPT_SORT_KEYS
_HOST = socket.gethostname()
_MAGIC = b"ce1:"  # a checksummed entry: b"ce1:" + sha256 hex of the JSON + b":" + the JSON
log = logging.getLogger("evaluator.llm")


class CacheEntry(BaseModel):
    """One stored reply. Strict: a field of the wrong type makes the whole entry damaged."""

    model_config = ConfigDict(frozen=True, strict=True, extra="ignore")

    content: str | None
    finish_reason: str | None
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    model: str = ""
    stored_at: float = 0.0
    reasoning_only: bool = False
    dropped: list[str] = Field(default_factory=list)  # fields the logical request had that the host refused
    # Why the reply ended early (reply.cut_cause); None: whole (or stored before causes were kept: derived).
    cut: str | None = None
    n_ctx: int | None = None  # the server's context size when it was stored (llama.cpp /props), if known
    run_id: str = ""  # the invocation that stored it (`invocation_id()`)
    tokens_estimated: bool = False  # the body had no usage: tokens by llm/budget.py's rule


# One id per invocation: a reply cut by a content filter is used by the invocation that got it only. Each command
# (`cli.main`) starts a new one: two commands in one process (a notebook, a child forked from a warm interpreter)
# are two invocations, as two processes are.
_INVOCATION = [uuid.uuid4().hex]


def invocation_id() -> str:
    """The id of the invocation this process is running now (stored with each reply as `run_id`)."""
    return _INVOCATION[0]


def new_invocation() -> None:
    """From here on this process runs another invocation: replies cut by a content filter before are sent again."""
    _INVOCATION[0] = uuid.uuid4().hex



def reusable(entry: CacheEntry, cut: str | None, n_ctx_now: int | None) -> bool:
    """Whether a stored reply stands for what the server would answer now (the one rule; see the module doc).

    A whole reply, or one cut at max_tokens (part of the key), always does. One cut by the server's
    context does while the server still has the context it was cut under (both known and equal); once
    the context is larger, or cannot be told, the call is sent again. One cut by a content filter (or any
    other cause) stands only for the invocation that received it: a later run sends it again.
    """
    if cut is None or cut == MAX_TOKENS:
        return True
    if cut == CONTEXT:
        return entry.n_ctx is not None and n_ctx_now is not None and n_ctx_now <= entry.n_ctx
    return entry.run_id == invocation_id()


def encode_entry(entry: CacheEntry) -> bytes:
    """The stored bytes of `entry`; its text loses every configured key (a reply is read redacted already, this
    holds for an entry made any other way too)."""
    d = entry.model_dump()
    if d["content"]:
        d["content"] = scrub(d["content"])
    data = orjson.dumps(d, option=_SORT)
    return _MAGIC + hashlib.sha256(data).hexdigest().encode() + b":" + data


def decode_entry(raw: Any) -> CacheEntry | None:
    """The entry in a stored value; None when it is damaged (checksum, JSON or fields)."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogateescape")
    if not isinstance(raw, bytes | bytearray):
        return None
    data = bytes(raw)
    if data.startswith(_MAGIC):
        digest, _, data = data[len(_MAGIC):].partition(b":")
        if hashlib.sha256(data).hexdigest().encode() != digest:
            return None
    try:
        return CacheEntry.model_validate(orjson.loads(data))
    except (orjson.JSONDecodeError, ValidationError):
        return None


class StoreError(FatalLLMError):
    """The cache could not store (disk full, I/O error, read-only): the command stops; `what` says why."""

    def __init__(self, message: str, *, full: bool) -> None:
        super().__init__(message)
        self.full = full


def cache_dir(root: Path | str) -> Path:
    return CacheLayout(root).llm


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
    return BODY_KEY + hashlib.sha256(orjson.dumps(fixed, option=_SORT)).hexdigest()


BODY_KEY = "body-"  # the prefix of a request file's keys: its body, not the profile, says its max_tokens


def profile_shaped(key: str) -> bool:
    """A key made by `call_key` (the study's calls): the request's max_tokens is the profile's."""
    return not key.startswith(BODY_KEY)


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


def _damaged(e: BaseException) -> bool:
    """SQLite says the file is not a database or a page is corrupt (not: locked, read-only, full)."""
    name = getattr(e, "sqlite_errorname", "")
    if name:
        return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))
    return type(e) is sqlite3.DatabaseError


def _full(e: BaseException) -> bool:
    if isinstance(e, OSError):
        return e.errno in (28, 122)  # ENOSPC, EDQUOT
    return getattr(e, "sqlite_errorname", "") == "SQLITE_FULL" or "disk is full" in str(e)


def _first_problem(check: list[tuple[Any, ...]]) -> str:
    """One line of `PRAGMA quick_check`'s report (its rows hold many lines), with how many more there are."""
    lines = [ln.strip() for row in check for ln in str(row[0]).splitlines() if ln.strip() and not ln.startswith("***")]
    first = lines[0][:160] if lines else "integrity check failed"
    return first + (f", and {len(lines) - 1} more problems" if len(lines) > 1 else "")


def _salvage(db_file: Path) -> tuple[list[tuple[str, bytes, str]], int]:
    """(key, value, tag) of every row of diskcache's `Cache` table that can be read and decodes; and how
    many rows were dropped. Rows are found by a table scan and by the key index (a damaged b-tree page
    hides its rows from one path, rarely from both), then read one by one. Dropped: the rows found that cannot
    be read, or at least as many as diskcache's own row count (the `count` of its `Settings` table, kept by its
    triggers) says are missing from what was kept (a damaged page can hide its rows from every path)."""
    try:
        con = sqlite3.connect(f"file:{db_file}?mode=ro", uri=True)
        con.execute("SELECT name FROM sqlite_master").fetchall()
    except sqlite3.Error as e:  # not a database at all: nothing to keep
        raise ConfigError(damaged_message(db_file, e)) from None
    disk = diskcache.Disk(str(db_file.parent))
    known: set[int] = set()  # rows some path of the file shows
    for query in ("SELECT rowid FROM Cache", "SELECT rowid FROM Cache INDEXED BY Cache_key_raw"):
        with contextlib.suppress(sqlite3.Error):
            for (rowid,) in con.execute(query):
                known.add(rowid)
    rowids = set(known)
    try:
        (top,) = con.execute("SELECT max(rowid) FROM Cache").fetchone()
        rowids |= set(range(1, (top or 0) + 1))
    except sqlite3.Error:
        pass
    stated = 0
    with contextlib.suppress(sqlite3.Error, TypeError, ValueError):
        stated = int(con.execute("SELECT value FROM Settings WHERE key = 'count'").fetchone()[0])
    kept: list[tuple[str, bytes, str]] = []
    lost = 0
    for rowid in sorted(rowids):
        try:
            row = con.execute("SELECT key, raw, tag, mode, filename, value FROM Cache WHERE rowid = ?", (rowid,)).fetchone()
            if row is None:
                lost += rowid in known  # shown by the scan or the index, gone at its place: a damaged page
                continue
            key = disk.get(row[0], bool(row[1]))
            value = disk.fetch(row[3], row[4], row[5], False)
        except Exception:  # noqa: BLE001 - anything unreadable in a damaged row: the row is dropped
            lost += 1
            continue
        if isinstance(key, str) and isinstance(value, bytes | str) and decode_entry(value) is not None:
            kept.append((key, value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value,
                         str(row[2] or "")))
        else:
            lost += 1
    con.close()
    return kept, max(lost, stated - len(kept))


_WAL_MAGIC = (0x377F0682, 0x377F0683)  # checksums of little- / big-endian words


def wal_lost_writes(wal: Path) -> int:
    """Writes (transactions; one stored reply each) of a SQLite write-ahead log that SQLite will not apply: those
    after its first damaged frame. SQLite drops them silently when it opens the database; counted here before
    it does. A torn last frame (a writer still at work) is not counted: only damage with frames after it."""
    try:
        data = wal.read_bytes()
    except OSError:
        return 0
    if len(data) < 32:
        return 0
    magic, _version, page, _seq, salt1, salt2 = struct.unpack(">6I", data[:24])
    if magic not in _WAL_MAGIC or page < 512 or page & (page - 1):
        return 0
    order = ">" if magic & 1 else "<"
    s0, s1 = _wal_sum(data[:24], order, 0, 0)
    if (s0, s1) != struct.unpack(">2I", data[24:32]):
        return 0
    frame = 24 + page
    frames = [data[off:off + frame] for off in range(32, len(data) - frame + 1, frame)]
    for i, f in enumerate(frames):
        _pgno, _commit, f1, f2, c0, c1 = struct.unpack(">6I", f[:24])
        if (f1, f2) != (salt1, salt2):
            return 0  # the end of this log's frames (older ones follow): nothing damaged
        s0, s1 = _wal_sum(f[:8], order, s0, s1)
        s0, s1 = _wal_sum(f[24:], order, s0, s1)
        if (s0, s1) != (c0, c1):
            rest = frames[i:]
            if len(rest) < 2:
                return 0  # the last frame: a writer may be writing it
            return sum(1 for g in rest if struct.unpack(">6I", g[:24])[2:4] == (salt1, salt2)
                       and struct.unpack(">I", g[4:8])[0] != 0)
    return 0


def _wal_sum(b: bytes, order: str, s0: int, s1: int) -> tuple[int, int]:
    """SQLite's WAL checksum over `b` (a multiple of 8 bytes), continued from (s0, s1)."""
    words = struct.unpack(f"{order}{len(b) // 4}I", b)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def damaged_message(db_file: Path, e: BaseException | str) -> str:
    e = " ".join(str(e).split())[:200]  # one line, whatever SQLite put in it
    return (f"the cache database {db_file} is damaged ({e}); move it away (e.g. `mv {db_file.parent} "
            f"{db_file.parent}.damaged`) and rerun: the replies in it will be requested again")


class ResponseCache:
    """Stored replies as checksummed `CacheEntry`s, tagged with the profile name so `clear --model`
    can find them.

    Opening checks that the cache can be written (a read-only folder or database, or a path that is
    a file, is a `ConfigError` with one line, before any paid work) and that its database is sound.
    """

    def __init__(self, root: Path | str) -> None:
        self.path = cache_dir(root)
        self.db_file = self.path / "cache.db"
        self.damaged: set[str] = set()  # keys whose stored value was damaged (a miss each)
        self.imported = 0  # replies imported from spill files of an earlier run
        self.repaired: tuple[int, int] | None = None  # (kept, dropped) when a damaged database was repaired at open
        # Replies in a damaged write-ahead log are dropped by SQLite when it opens the file: counted now, said below.
        self.wal_lost = wal_lost_writes(Path(str(self.db_file) + "-wal"))
        opening = self.db_file
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            # eviction off: an evicted reply would be silently re-bought and break exact resume.
            try:
                self._db = diskcache.Cache(str(self.path), eviction_policy="none", statistics=0)
                check = self._db._sql("PRAGMA quick_check").fetchall()
                if check != [("ok",)]:
                    self._db.close()
                    self._db = self._repair(_first_problem(check))
            except sqlite3.DatabaseError as e:
                if not _damaged(e) or not self.db_file.is_file():
                    raise
                self._db = self._repair(str(e))  # a damaged page diskcache itself could not read past
            claims = CacheLayout(root).claims
            opening = claims / "cache.db"
            # Claims need not survive a power cut (a lost claim only costs a duplicate), so no fsync.
            self._claims = diskcache.Cache(
                str(claims), eviction_policy="none", statistics=0, sqlite_synchronous=0
            )
            if self.wal_lost and self.repaired is None:
                log.warning("the cache database's write-ahead log %s-wal was damaged: the last %d replies stored in it "
                            "were lost (those calls are requested again)", self.db_file, self.wal_lost)
            with self._db.transact(retry=True):  # BEGIN IMMEDIATE: fails now on a read-only database
                pass
            with self._claims.transact(retry=True):
                pass
        except (OSError, sqlite3.Error) as e:
            if isinstance(e, sqlite3.Error) and _damaged(e):
                raise ConfigError(damaged_message(opening, e)) from None
            raise ConfigError(_not_writable(self.path, e)) from None
        self._import_spills()

    def _repair(self, problem: str) -> diskcache.Cache:
        """Keep every row of a damaged database that can still be read and holds its checksum; drop the rest.

        The damaged file is moved aside (`cache.db.damaged-<time>`), a new one gets the rows kept, and one
        warning says how many were kept and dropped. A file SQLite cannot read at all is one line (ConfigError).
        """
        kept, lost = _salvage(self.db_file)
        lost += self.wal_lost  # replies of a damaged write-ahead log, dropped before the salvage could see them
        aside = self.db_file.with_name(f"cache.db.damaged-{int(time.time())}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(self.db_file) + suffix)
            if src.exists():
                os.replace(src, Path(str(aside) + suffix))
        db = diskcache.Cache(str(self.path), eviction_policy="none", statistics=0)
        for key, value, tag in kept:
            db.set(key, value, tag=tag, retry=True)
        log.warning(
            "the cache database %s was damaged (%s); repaired: %d replies kept, %d damaged rows dropped (those calls "
            "are requested again); the damaged file is kept as %s", self.db_file, " ".join(problem.split())[:200], len(kept),
            lost, aside.name,
        )
        self.repaired = (len(kept), lost)
        return db

    def _fail(self, e: BaseException, what: str) -> FatalLLMError:
        """A storage error as one line saying what to do."""
        if isinstance(e, sqlite3.Error) and _damaged(e):
            return FatalLLMError(damaged_message(self.db_file, e))
        if _full(e):
            return StoreError(f"cannot {what} in the cache {self.path}: the disk is full ({e}); free space on "
                              f"that disk (or point --cache-dir elsewhere) and rerun the same command", full=True)
        return StoreError(_not_writable(self.path, e), full=False)

    # -- replies ---------------------------------------------------------------------------------
    def get(self, key: str) -> CacheEntry | None:
        """The stored entry; None when absent or damaged (then counted in `damaged`)."""
        try:
            raw = self._db.get(key, retry=True)  # another process writing: wait, it is not damage
        except sqlite3.Error as e:
            raise self._fail(e, "read a reply") from None
        except Exception:  # noqa: BLE001 - a row diskcache cannot decode (other mode, lost file): damaged
            raw = b"?"
        if raw is None:
            return None
        entry = decode_entry(raw)
        if entry is None:
            self.damaged.add(key)
        return entry

    def set(self, key: str, entry: CacheEntry, tag: str) -> None:
        self.set_raw(key, encode_entry(entry), tag)

    def set_raw(self, key: str, value: bytes, tag: str) -> None:
        try:
            self._db.set(key, value, tag=tag, retry=True)
        except (OSError, sqlite3.Error) as e:  # disk full, the folder made read-only mid-run, ...
            raise self._fail(e, "store a reply") from None

    def __len__(self) -> int:
        return len(self._db)

    # -- replies that could not be stored ----------------------------------------------------------
    def _spill_name(self) -> str:
        return "evaluator-spill-" + hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:12]

    def _spill_dirs(self) -> list[Path]:
        return [self.path, Path(tempfile.gettempdir())]

    def spill(self, entries: Mapping[str, tuple[str, CacheEntry]]) -> Path | None:
        """Write replies that could not be stored to a spill file the next open imports; its path,
        or None when no folder could take it (no partial file is left behind)."""
        lines = b"".join(
            orjson.dumps({"key": k, "tag": tag, "value": encode_entry(e).decode()}) + b"\n"
            for k, (tag, e) in entries.items()
        )
        for folder in self._spill_dirs():
            path = folder / f"{self._spill_name()}-{uuid.uuid4().hex[:8]}.jsonl"
            try:
                atomic_write(path, lines)
                return path
            except OSError:
                continue  # the next folder
        return None

    def _import_spills(self) -> None:
        for folder in self._spill_dirs():
            for path in sorted(folder.glob(self._spill_name() + "-*.jsonl")):
                try:
                    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
                except (OSError, orjson.JSONDecodeError) as e:
                    log.warning("cannot import the replies kept in %s (%s); they will be requested again", path, e)
                    continue
                for row in rows:
                    if not isinstance(row, dict) or not isinstance(row.get("key"), str):
                        continue  # not a row this code wrote: the call is simply requested again
                    value = str(row.get("value", "")).encode()
                    if decode_entry(value) is not None and self._db.get(row["key"]) is None:
                        self.set_raw(row["key"], value, str(row.get("tag") or ""))
                        self.imported += 1
                with contextlib.suppress(OSError):  # imported; a file left behind is imported again harmlessly
                    path.unlink()

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
            raise self._fail(e, "claim a call") from None
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
        """Free claims; never raises: a claim that cannot be freed runs out with its lease (or its
        owner's death), so another process waits at most that long for it."""
        try:
            with self._claims.transact(retry=True):
                for key in keys:
                    if self._claims.get(key) == owner:
                        self._claims.delete(key, retry=True)
        except (OSError, sqlite3.Error) as e:
            log.debug("cannot free claims in %s (%s); they run out with their lease", self.path, e)

    def close(self) -> None:
        for db in (getattr(self, "_db", None), getattr(self, "_claims", None)):
            if db is not None:
                with contextlib.suppress(sqlite3.Error, OSError):
                    db.close()


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
