"""Nothing damaged in the response cache is ever used (issue 18): a damaged entry is a miss, re-fetched
with one counted warning; a damaged database file is one line; a full disk stops the run with one line
and keeps the replies already received for the next run."""

from __future__ import annotations

import asyncio
import logging
import sqlite3

import orjson
import pytest
from helpers import llm as F

from evaluator.core.errors import ConfigError, FatalLLMError
from evaluator.llm.cache import CacheEntry, ResponseCache, cache_dir, decode_entry, encode_entry


@pytest.fixture
def sim() -> F.LocalSim:
    """The simulator in this process, behind the engine's in-process transport (no socket)."""
    return F.LocalSim()


async def _run(sim, root, idx, **kw):
    async with sim.engine(F.sim_profile(sim, **kw), cache_root=root) as llm:
        rs = await asyncio.gather(*(llm.chat(F.msgs(i), run=0, prompt_version="v1") for i in idx))
    return llm, rs


def _rows(root):
    return [r[1] for r in _sql(root, "SELECT rowid, key FROM Cache ORDER BY rowid")]


def _sql(root, query, args=()):
    con = sqlite3.connect(cache_dir(root) / "cache.db")
    try:
        rows = con.execute(query, args).fetchall()
        con.commit()
        return rows
    finally:
        con.close()


def _value(root, key) -> bytes:
    return _sql(root, "SELECT value FROM Cache WHERE key = ?", (key,))[0][0]


def _put(root, key, value: bytes) -> None:
    _sql(root, "UPDATE Cache SET value = ? WHERE key = ?", (value, key))


def _flip_in_text(value: bytes) -> bytes:
    """Change one byte inside the reply text: still valid JSON, still valid SQLite."""
    i = value.index(b'"content":"') + len(b'"content":"') + 2
    return value[:i] + bytes([value[i] ^ 0x01]) + value[i + 1:]


def test_entries_round_trip_and_old_plain_entries_are_still_read():
    e = CacheEntry(content="x", finish_reason="stop", prompt_tokens=3, completion_tokens=2, model="m", dropped=["seed"])
    assert decode_entry(encode_entry(e)) == e
    # What the release before checksums stored: plain JSON, still a hit (nothing to check it against).
    old = orjson.dumps({"content": "x", "finish_reason": "stop", "prompt_tokens": 3, "completion_tokens": 2,
                        "model": "m", "stored_at": 1.5})
    assert decode_entry(old).content == "x"


@pytest.mark.parametrize(
    "damage",
    ["flipped_text", "other_json", "missing_keys", "wrong_type", "not_json"],
)
async def test_a_damaged_entry_is_a_miss_refetched_with_one_counted_warning(sim, tmp_path, caplog, damage):
    _, first = await _run(sim, tmp_path, range(4))
    keys = _rows(tmp_path)
    good = _value(tmp_path, keys[1])
    damaged = {
        "flipped_text": _flip_in_text(good),
        "other_json": orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion"}),
        "missing_keys": orjson.dumps({"content": "x", "prompt_tokens": 1, "completion_tokens": 1}),
        "wrong_type": orjson.dumps({"content": "x", "finish_reason": "stop", "prompt_tokens": "7", "completion_tokens": 1}),
        "not_json": b"\x00\xffgarbage",
    }[damage]
    _put(tmp_path, keys[1], damaged)
    caplog.set_level(logging.WARNING, logger="evaluator.llm")
    before = sim.stats()["requests"]
    llm, again = await _run(sim, tmp_path, range(4))
    # Identical numbers: the damaged reply was not used but bought again, and stored over the damage.
    assert [r.content for r in again] == [r.content for r in first]
    assert sim.stats()["requests"] - before == 1 and llm.stats.cache_damaged == 1
    assert [r.cached for r in again].count(False) == 1
    warned = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(warned) == 1 and "1 cached replies were damaged" in warned[0]
    assert llm.stats.as_dict()["cache_damaged"] == 1
    assert decode_entry(_value(tmp_path, keys[1])) is not None  # repaired


def test_a_file_that_is_not_a_database_is_one_line_at_open(tmp_path):
    path = cache_dir(tmp_path)
    path.mkdir(parents=True)
    (path / "cache.db").write_bytes(b"this is not an SQLite database, just text " * 200)
    with pytest.raises(ConfigError) as e:
        ResponseCache(tmp_path)
    msg = str(e.value)
    assert str(path / "cache.db") in msg and "damaged" in msg and "move it away" in msg and "\n" not in msg


# A corrupt page found at open is repaired, dropping only the damaged rows (issue 31):
# tests/test_llm_reply_faults.py::test_damaged_pages_are_one_line_and_only_the_damaged_rows_are_dropped


async def test_a_database_damaged_mid_run_stops_with_one_line(sim, tmp_path):
    async with sim.engine(F.sim_profile(sim), cache_root=tmp_path) as llm:
        await llm.chat(F.msgs(1), run=0, prompt_version="v1")

        def malformed(*_a, **_k):
            raise sqlite3.DatabaseError("database disk image is malformed")

        llm._cache._db.get = malformed  # what SQLite raises on a page damaged after the open check
        with pytest.raises(FatalLLMError) as e:
            await llm.chat(F.msgs(2), run=0, prompt_version="v1")
    assert "cache.db is damaged" in str(e.value) and "move it away" in str(e.value)


async def test_a_full_disk_stops_the_run_and_keeps_what_was_received(sim, tmp_path):
    sim.configure(latency_s=0.05)
    _, reference = await _run(sim, tmp_path / "reference", range(8))
    sim.reset_stats()
    root = tmp_path / "cache"
    stored = 0
    async with sim.engine(F.sim_profile(sim, concurrency=4), cache_root=root) as llm:
        real_set, real_delete = llm._cache._db.set, llm._cache._claims.delete

        def fills_up(*a, **k):
            nonlocal stored
            if stored >= 3:
                raise sqlite3.OperationalError("database or disk is full")
            stored += 1
            return real_set(*a, **k)

        def delete_fails(*a, **k):  # freeing the claim in the `finally` fails the same way
            raise sqlite3.OperationalError("database or disk is full")

        llm._cache._db.set = fills_up
        llm._cache._claims.delete = delete_fails
        tasks = [asyncio.create_task(llm.chat(F.msgs(i), run=0, prompt_version="v1")) for i in range(8)]
        done = await asyncio.gather(*tasks, return_exceptions=True)
        llm._cache._db.set, llm._cache._claims.delete = real_set, real_delete
    errors = [d for d in done if isinstance(d, BaseException)]
    assert errors and all(isinstance(d, FatalLLMError) for d in errors)  # no OperationalError, no traceback
    msg = str(errors[0])
    assert "the disk is full" in msg and "free space" in msg and "\n" not in msg
    assert "the reply received is kept in" in msg and "spill" in msg
    received = sim.stats()["by_status"].get("200", 0)
    spills = list(cache_dir(root).glob("evaluator-spill-*.jsonl"))
    assert spills and not list(cache_dir(root).glob("*.tmp"))
    # The rerun imports the kept replies and buys only what never arrived: nothing is paid twice.
    sim.reset_stats()
    _, again = await _run(sim, root, range(8))
    assert [r.content for r in again] == [r.content for r in reference]
    assert sim.stats()["requests"] == 8 - received
    assert not list(cache_dir(root).glob("evaluator-spill-*.jsonl"))
