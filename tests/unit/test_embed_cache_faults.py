"""A damaged or unwritable embedding cache: recomputed with a warning, or one clear line."""

from __future__ import annotations

import errno
import os
import sys

import numpy as np
import pytest

from evaluator.core.errors import EmbedderError
from evaluator.core.progress import Reporter
from evaluator.retrieval.embed import Embedder

TEXTS = ["Weather/current: the current weather for a city", "Maps/route: a route between two places"]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_damaged_shard_is_skipped_with_a_warning_and_recomputed(tmp_path, capsys, damage):
    first = Embedder(cache_dir=tmp_path, progress=False)
    ref = first.encode(TEXTS)
    (shard,) = first.store.root.glob("shard-*.npz")
    raw = shard.read_bytes()
    shard.write_bytes({"truncate": raw[: len(raw) // 2], "garbage": b"not a zip" * 10, "empty": b""}[damage])
    capsys.readouterr()

    again = Embedder(cache_dir=tmp_path, progress=False, reporter=Reporter(sys.stderr))  # as the CLI hands it
    assert np.allclose(again.encode(TEXTS), ref, atol=1e-6)
    assert again.stats.embedded == len(TEXTS)
    err = capsys.readouterr().err
    assert "damaged embedding cache file" in err and shard.name in err

    third = Embedder(cache_dir=tmp_path, progress=False, reporter=Reporter(sys.stderr))  # the recomputed shard serves; no new warning
    assert np.allclose(third.encode(TEXTS), ref, atol=1e-6) and third.stats.embedded == 0
    assert "damaged" not in capsys.readouterr().err


def test_cache_dir_that_cannot_hold_embeddings_is_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(EmbedderError) as err:
        Embedder(cache_dir=blocker / "cache", progress=False).encode(TEXTS)
    assert str(err.value) == f"cache dir {blocker / 'cache'} is not writable; use --cache-dir"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_cache_dir_is_one_line_and_a_warm_one_still_reads(tmp_path):
    Embedder(cache_dir=tmp_path, progress=False).encode(TEXTS[:1])
    for d in [tmp_path, *tmp_path.rglob("*")]:
        if d.is_dir():
            d.chmod(0o555)
    try:
        warm = Embedder(cache_dir=tmp_path, progress=False)
        assert warm.encode(TEXTS[:1]).shape == (1, 384)  # nothing to write: reading is enough
        with pytest.raises(EmbedderError, match=f"cache dir {tmp_path} is not writable; use --cache-dir"):
            Embedder(cache_dir=tmp_path, progress=False).encode(TEXTS)
    finally:
        for d in [tmp_path, *tmp_path.rglob("*")]:
            if d.is_dir():
                d.chmod(0o755)


@pytest.mark.parametrize("code,expected", [
    (errno.EROFS, "is not writable; use --cache-dir"),  # a read-only mount, which root cannot write either
    (errno.ENOSPC, "cannot write the embedding cache in"),  # a full disk
])
def test_failing_shard_write_is_one_line_not_a_traceback(tmp_path, monkeypatch, code, expected):
    def fail(*a, **k):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(np, "savez", fail)
    with pytest.raises(EmbedderError, match=expected) as err:
        Embedder(cache_dir=tmp_path, progress=False).encode(TEXTS)
    assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)
    assert not list(tmp_path.rglob(".shard-*.tmp"))  # no half-written file left behind
