"""Nothing damaged is used, bad content has a rule, storage failures are one line (issue 18).

Each test states the outcome a user sees: a cut description and a counted warning, a damaged embedding
shard re-embedded with one warning and the same numbers, a conflicting batch reply re-requested, a full
disk as one line with no temporary file left behind.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest

from evaluator.batch.request_files import import_files
from evaluator.batch.request_format import Result, dedupe, write_lines
from evaluator.cli import main as cli
from evaluator.data import Warnings, load_registry
from evaluator.data.model import DESCRIPTION_CAP_CHARS
from evaluator.llm.cache import ResponseCache
from evaluator.results.schema import atomic_write
from evaluator.retrieval.embed import Embedder, EmbedderError
from evaluator.retrieval.embed import _key as embed_key
from evaluator.retrieval.index import VectorIndex
from evaluator.study.prompts import api_line, planner_messages


# -- oversized tool descriptions -------------------------------------------------------------------------
def _registry_file(tmp_path, descriptions):
    p = tmp_path / "apis.jsonl"
    p.write_text("".join(json.dumps({"tool_name": "T", "api_name": f"a{i}", "api_description": d}) + "\n"
                         for i, d in enumerate(descriptions)))
    return p


def test_a_huge_description_is_cut_in_the_prompt_and_counted(tmp_path):
    huge = "word " * 200_000  # ~1 MB: before, sent whole in every planner prompt (~1.03M prompt tokens)
    short = "Daily weather\nforecast  for a city"
    w = Warnings()
    reg = load_registry(_registry_file(tmp_path, [huge, short, "x" * DESCRIPTION_CAP_CHARS]), warnings=w)
    assert w.counts["long_description"] == 1  # the one at the cap is shown whole
    assert "T/a0" in w.examples["long_description"][0]
    apis = [(a.display, a.description) for a in reg.apis]
    user = planner_messages("find the weather", apis)[1]["content"]
    assert len(user) < 2 * DESCRIPTION_CAP_CHARS + 200  # the cap, plus the one at the cap, plus the frame
    assert "- T/a0: word word" in user and "[...]" in user
    # Below the cap a line is exactly what it was (cache keys and ToolBench numbers unchanged).
    assert api_line("T/a1", short) == "- T/a1: Daily weather forecast for a city"
    assert api_line("T/a2", "x" * DESCRIPTION_CAP_CHARS) == "- T/a2: " + "x" * DESCRIPTION_CAP_CHARS


def test_dedupe_keeps_identical_copies_and_drops_conflicts():
    ok = {"id": "a", "choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]}
    other = {"id": "b", "choices": [{"message": {"content": "y"}, "finish_reason": "stop"}]}
    rs = [Result("k1", 200, {**ok, "id": "copy"}), Result("k1", 200, ok), Result("k2", 200, other),
          Result("k2", 200, ok), Result("k3", 500, {"error": {"message": "boom"}}), Result("k3", 500, None)]
    kept, conflicts = dedupe(rs)
    assert [r.custom_id for r in kept] == ["k1", "k3"] and conflicts == ["k2"]


# -- damaged embedding shards ------------------------------------------------------------------------------
REGISTRY_TEXTS = ["Weather/current: the current weather for a city", "Maps/route: a route between two places",
                  "Stocks/quote: the last price of a ticker"]
QUERY_TEXTS = ["what is the weather in Paris", "how do I drive to Rome"]


def _embedder(root, warnings):
    e = Embedder(cache_dir=root, progress=False)
    e.store.warn = warnings.append
    return e


def _top(api, queries):
    return VectorIndex(api).search(queries, 2)


@pytest.mark.parametrize("damage", ["nan", "inf", "dim10", "float64", "flipped"])
def test_damaged_embedding_shard_is_recomputed_with_one_warning(tmp_path, damage):
    warnings: list[str] = []
    first = _embedder(tmp_path, warnings)
    api, queries = first.encode(REGISTRY_TEXTS), first.encode(QUERY_TEXTS)  # two sealed shards
    ref = _top(api, queries)
    reg_keys = {embed_key(t) for t in REGISTRY_TEXTS}
    (shard,) = [s for s in first.store.root.glob("shard-*.npz")
                if {bytes(k).ljust(16, b"\0") for k in np.load(s)["keys"]} == reg_keys]
    with np.load(shard) as z:
        arrays = {k: z[k] for k in z.files}
    vecs = arrays["vecs"]
    if damage == "flipped":  # the content changed under an intact zip: only the checksum tells
        bad = vecs.copy()
        bad[0, :4] = bad[0, :4][::-1]
        np.savez(shard, **{**arrays, "vecs": bad})
    else:  # a valid npz as an older version (no checksum) or a foreign tool would write it
        bad = {"nan": np.full_like(vecs, np.nan), "inf": np.where(vecs > 0, np.inf, vecs), "dim10": vecs[:, :10].copy(),
               "float64": vecs.astype(np.float64)}[damage]
        np.savez(shard, keys=arrays["keys"], vecs=bad)
    assert not warnings

    again = _embedder(tmp_path, warnings)
    api2, queries2 = again.encode(REGISTRY_TEXTS), again.encode(QUERY_TEXTS)
    # Before: NaN vectors were used silently (other numbers), 10-dim ones ended in faiss' AssertionError.
    assert np.allclose(api2, api, atol=1e-6) and np.allclose(queries2, queries, atol=1e-6)
    got = _top(api2, queries2)
    assert np.array_equal(got[1], ref[1])  # the same retrieval, so the same RtP/PtR numbers
    assert again.stats.embedded == len(REGISTRY_TEXTS) and again.stats.cache_hits == len(QUERY_TEXTS)
    assert len(warnings) == 1 and warnings[0].startswith("1 damaged embedding cache file(s)"), warnings
    assert (shard.parent / (shard.name + ".damaged")).exists()
    third = _embedder(tmp_path, warnings)  # the recomputed shard serves; no further warning
    assert np.allclose(third.encode(REGISTRY_TEXTS), api, atol=1e-6) and third.stats.embedded == 0
    assert len(warnings) == 1


def test_several_damaged_shards_are_one_warning_that_counts_them(tmp_path):
    warnings: list[str] = []
    first = _embedder(tmp_path, warnings)
    for t in REGISTRY_TEXTS:
        first.encode([t])  # one shard each
    for s in first.store.root.glob("shard-*.npz"):
        with np.load(s) as z:
            keys, vecs = z["keys"], z["vecs"]
        np.savez(s, keys=keys, vecs=np.full_like(vecs, np.nan))
    _embedder(tmp_path, warnings).encode(REGISTRY_TEXTS)
    assert len(warnings) == 1 and warnings[0].startswith("3 damaged embedding cache file(s) set aside as *.damaged "
                                                         "(3 NaN/inf vectors"), warnings


# -- a full disk ---------------------------------------------------------------------------------------------------
def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_writing_an_output_is_one_line_and_leaves_no_temporary_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "report.md").write_text("old report")
    monkeypatch.setattr(Path, "write_text", _no_space)
    with pytest.raises(OSError) as e:
        atomic_write(tmp_path / "report.md", "new report")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "report.md")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]  # no .tmp left; the old file kept
    monkeypatch.undo()
    assert (tmp_path / "report.md").read_text() == "old report"

    # The CLI turns it into one line saying what to free (any command that writes an output folder).
    monkeypatch.setattr("evaluator.cli.main.HANDLERS", {"report": lambda argv: atomic_write(tmp_path / "report.md", "x")})
    monkeypatch.setattr(Path, "write_text", _no_space)
    assert cli.main(["report", str(tmp_path)]) == cli.EXIT_STOPPED
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: cannot read or write {tmp_path / 'report.md'}: No space left on device. "
                   "Free space on that disk (or pass another --out / --cache-dir) and rerun."]


def test_full_disk_writing_an_embedding_shard_is_one_line_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    emb = Embedder(cache_dir=tmp_path, progress=False)
    real_savez = np.savez

    def savez_then_full(fh, **arrays):
        real_savez(fh, **arrays)  # half the work is done when the disk fills
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", savez_then_full)
    with pytest.raises(EmbedderError) as e:
        emb.encode(REGISTRY_TEXTS)
    assert str(e.value) == (f"cannot write the embedding cache in {tmp_path} (No space left on device); free space on "
                            "that disk or use --cache-dir on another")
    assert [p.name for p in emb.store.root.iterdir()] == []  # no temporary shard left behind


def test_requests_import_trusts_neither_copy_of_a_conflicting_custom_id(tmp_path):
    def reply(text):
        return {"id": "x", "object": "chat.completion", "model": "sim-1", "usage": {"prompt_tokens": 5, "completion_tokens": 3},
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}

    results = tmp_path / "results.jsonl"
    write_lines(results, [Result("k-conflict", 200, reply("forged")), Result("k-same", 200, reply("fine")),
                          Result("k-conflict", 200, reply("original")), Result("k-same", 200, {**reply("fine"), "id": "y"})])
    counts = import_files([results], tmp_path / "cache", model="sim")
    assert counts.stored == 1 and counts.errors == 1
    assert counts.first_errors == ["k-conflict: different replies for this custom_id; neither is imported"]
    cache = ResponseCache(tmp_path / "cache")
    try:
        assert cache.get("k-conflict") is None and cache.get("k-same") is not None
    finally:
        cache.close()
