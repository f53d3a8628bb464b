"""An embedding shard of an older release (no checksum) whose vectors are zeroed or permuted is not used
(issue 31, item 10): its texts are embedded once more into checksummed shards, with one warning; the results
are those of a sound cache, and the next run is warm again. Driven through the CLI (`--retrieval-only`)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.cli import run_cli
from helpers.data import make_data_dir


def _run(data, cache, out):
    r = run_cli("--retrieval-only", "--data", str(data), "--cache-dir", str(cache), "--out", str(out),
                "--no-progress", cwd=out.parent)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


@pytest.mark.parametrize("damage", ["zeroed", "permuted"])
def test_an_old_shard_without_checksum_is_embedded_again_once(tmp_path, damage):
    data, cache = make_data_dir(tmp_path / "data"), tmp_path / "cache"
    _run(data, cache, tmp_path / "first")
    shards = sorted(cache.rglob("embeddings/**/shard-*.npz"))
    assert shards
    for shard in shards:  # as an older release wrote them: keys and vectors only, no dim, dtype or checksum
        with np.load(shard) as z:
            keys, vecs = z["keys"], z["vecs"]
        bad = np.zeros_like(vecs) if damage == "zeroed" else vecs[np.roll(np.arange(len(vecs)), 1)]
        with open(shard, "wb") as fh:
            np.savez(fh, keys=keys, vecs=bad)
    r = _run(data, cache, tmp_path / "second")
    assert "without a checksum" in r.stderr and "embedded once more" in r.stderr
    assert (tmp_path / "second" / "queries.jsonl").read_bytes() == (tmp_path / "first" / "queries.jsonl").read_bytes()
    assert len(list(cache.rglob("*.unsealed"))) == len(shards)
    r = _run(data, cache, tmp_path / "third")
    assert "checksum" not in r.stderr and "damaged" not in r.stderr
    assert (tmp_path / "third" / "queries.jsonl").read_bytes() == (tmp_path / "first" / "queries.jsonl").read_bytes()
