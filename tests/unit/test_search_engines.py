"""The torch exact search (the GPU's, and a CPU's without faiss) gives FAISS's lists, and the study runs without faiss.

Integer-valued vectors make every inner product exact in float32 whatever the summation order, so the two
engines' scores are equal and the lists differ only if the rows kept among exact ties or their order
differ: the cases below are full of ties (k at a tie, k > the index, subsets of rows, one query and the
batched path FAISS takes from 20 queries)."""

from __future__ import annotations

import numpy as np
import pytest

from evaluator.core.errors import EmbedderError
from evaluator.retrieval import index as ix
from evaluator.retrieval.index import TorchFlat, VectorIndex, choose_engine

faiss = pytest.importorskip("faiss")


def _faiss(data: np.ndarray):
    index = faiss.IndexFlatIP(data.shape[1])
    index.add(np.ascontiguousarray(data, dtype=np.float32))
    return index


def _ties(seed: int, n: int, d: int, nq: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(-1, 2, (n, d)).astype(np.float32), rng.integers(-1, 2, (nq, d)).astype(np.float32))


@pytest.mark.parametrize("nq", [1, 7, 25])  # FAISS scores 20 queries or more with BLAS, fewer one by one
@pytest.mark.parametrize("k", [1, 2, 5, 28, 99, 300])  # 300 > every index below: the slots past it
def test_torch_search_returns_faiss_lists_with_ties(nq: int, k: int) -> None:
    for seed, (n, d) in enumerate([(40, 2), (157, 3), (260, 4)]):
        data, queries = _ties(seed * 31 + nq + k, n, d, nq)
        want_s, want_r = _faiss(data).search(queries, k)
        got_s, got_r = TorchFlat(data).search(queries, k)
        assert np.array_equal(got_r, want_r), (n, d)
        assert np.array_equal(got_s, want_s)
        if k > n:  # FAISS's padding: row -1 scored -FLT_MAX
            assert (got_r[:, n:] == -1).all() and (got_s[:, n:] == np.finfo(np.float32).min).all()


def test_ties_at_the_kth_place_are_kept_as_faiss_keeps_them() -> None:
    """FAISS keeps neither the lowest nor the highest rows of a tie at the k-th score; the torch search agrees."""
    data = np.array([[1, 0], [0, 1], [1, 0], [1, 0], [0, 0], [1, 0], [0.5, 0]], np.float32)
    q = np.array([[1, 0]], np.float32)
    for k, rows in [(1, [0]), (2, [2, 0]), (4, [5, 3, 2, 0]), (6, [5, 3, 2, 0, 6, 4]), (7, [5, 3, 2, 0, 6, 4, 1])]:
        assert _faiss(data).search(q, k)[1][0].tolist() == rows
        assert TorchFlat(data).search(q, k)[1][0].tolist() == rows


def test_vector_index_engines_agree_on_sub_registries_and_exact_search() -> None:
    """Unit vectors with exact duplicates (as the registry's case-only twins): the same candidates, the same
    float64-rescored lists, for the whole matrix and for a subset of its rows."""
    rng = np.random.default_rng(7)
    base = rng.normal(size=(500, 32)).astype(np.float32)
    base[250:300] = base[0:50]  # exact twins
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = np.concatenate([base[:10], rng.normal(size=(30, 32)).astype(np.float32)])
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    for rows in (None, rng.choice(500, 180, replace=False)):
        f = VectorIndex(base, rows, engine="faiss")
        t = VectorIndex(base, rows, engine="torch")
        assert (f.engine, t.engine) == ("faiss", "torch") and len(f) == len(t)
        for k in (1, 5, 20, 108, 600):
            fs, fr = f.search(queries, k)
            ts, tr = t.search(queries, k)
            assert np.array_equal(fr, tr) and np.allclose(fs, ts, atol=1e-6)
            assert all(np.array_equal(a, b) for a, b in zip(f.exact_search(queries, k), t.exact_search(queries, k), strict=True))
        assert t.search(queries[:0], 5)[1].shape == (0, 5)
    assert VectorIndex(base, engine="torch").description == "torch exact top-k (cpu)"
    assert VectorIndex(base).description == "faiss IndexFlatIP (cpu)"


def test_torch_search_in_chunks_equals_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    data, queries = _ties(3, 300, 3, 50)
    whole = TorchFlat(data).search(queries, 12)
    monkeypatch.setattr(ix, "_CPU_CELLS", 300 * 7)  # 7 queries a chunk
    chunked = TorchFlat(data).search(queries, 12)
    assert all(np.array_equal(a, b) for a, b in zip(whole, chunked, strict=True))


def test_the_engine_is_faiss_on_a_cpu_torch_on_a_gpu_or_without_faiss(monkeypatch: pytest.MonkeyPatch) -> None:
    assert choose_engine("auto", "cpu") == "faiss"
    assert choose_engine("auto", "cuda") == choose_engine("auto", "cuda:1") == "torch"
    assert choose_engine("torch", "cpu") == "torch"
    with pytest.raises(EmbedderError, match="runs on the CPU"):
        choose_engine("faiss", "cuda")
    with pytest.raises(EmbedderError, match="must be one of"):
        choose_engine("annoy", "cpu")
    monkeypatch.setattr(ix, "importable", lambda name: name != "faiss")
    assert choose_engine("auto", "cpu") == "torch"
    with pytest.raises(EmbedderError, match="pip install faiss-cpu"):
        choose_engine("faiss", "cpu")
