"""The stub-search memo: every vector searched once, results kept on disk by vector and matrix, and
what it returns is what `exact_search` returns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evaluator.retrieval.index import SearchMemo, VectorIndex


def _data(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    api = rng.standard_normal((300, 8)).astype(np.float32)
    api[::7] = api[3]  # exact duplicates: ties the search orders by row
    api /= np.linalg.norm(api, axis=1, keepdims=True)
    q = (api[rng.choice(300, 40)] + 0.05 * rng.standard_normal((40, 8))).astype(np.float32)
    return api, np.concatenate([q, q[:10]])  # repeated queries, as stubs repeat across runs


def test_memo_returns_exact_search_and_reads_it_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api, q = _data()
    index = VectorIndex(api)
    expect = index.exact_search(q, 10)
    first = SearchMemo(index, 10, tmp_path)
    got = first.search(q)
    assert np.array_equal(got[1], expect[1]) and np.array_equal(got[0], expect[0])

    def no_search(*_a: object, **_k: object) -> None:
        raise AssertionError("searched again")

    monkeypatch.setattr(index, "exact_search", no_search)
    again = SearchMemo(index, 10, tmp_path).search(q[::-1])  # another process, another order
    assert np.array_equal(again[1], expect[1][::-1]) and np.array_equal(again[0], expect[0][::-1])


def test_another_matrix_or_a_damaged_shard_is_searched_anew(tmp_path: Path) -> None:
    api, q = _data()
    SearchMemo(VectorIndex(api), 5, tmp_path).search(q)
    other = VectorIndex(_data(2)[0])
    assert np.array_equal(SearchMemo(other, 5, tmp_path).search(q)[1], other.exact_search(q, 5)[1])
    for shard in tmp_path.rglob("shard-*.npz"):
        shard.write_bytes(b"not a shard")
    index = VectorIndex(api)
    memo = SearchMemo(index, 5, tmp_path)
    assert not memo.found
    assert np.array_equal(memo.search(q)[1], index.exact_search(q, 5)[1])


def test_subset_searches_are_kept_and_an_unchanged_rerun_makes_no_pass(tmp_path: Path) -> None:
    """The scaling study's sub-registry searches: a second SubsetSearch over the same matrix and
    queries reads every result back (no full pass), equal to a fresh search; other queries, another
    k or a damaged file search again."""
    from evaluator.retrieval.index import SubsetSearch

    api, q = _data()
    rng = np.random.default_rng(4)
    subsets = [np.sort(rng.choice(300, size, replace=False)) for size in (30, 90, 300)]
    fresh = SubsetSearch(api, q, 5, 30)
    expect = [fresh.search(rows, 5) for rows in subsets]
    first = SubsetSearch(api, q, 5, 30, folder=tmp_path)
    for rows, (s, r) in zip(subsets, expect, strict=True):
        got = first.search(rows, 5)
        assert np.array_equal(got[0], s) and np.array_equal(got[1], r)
    first.save()
    again = SubsetSearch(api, q, 5, 30, folder=tmp_path)
    for rows, (s, r) in zip(subsets, expect, strict=True):
        got = again.search(rows, 5)
        assert np.array_equal(got[0], s) and np.array_equal(got[1], r)
    assert not again._built  # every result read back: the pass over the registry was not made
    assert not SubsetSearch(api, q[:20], 5, 30, folder=tmp_path)._memo  # other queries: another file
    other_k = SubsetSearch(api, q, 5, 30, folder=tmp_path)
    other_k.search(subsets[0], 3)
    assert other_k._built
    for f in tmp_path.glob("subsets-*.npz"):
        f.write_bytes(b"damaged")
    damaged = SubsetSearch(api, q, 5, 30, folder=tmp_path)
    assert np.array_equal(damaged.search(subsets[1], 5)[1], expect[1][1]) and damaged._built
