"""BM25 (evaluator.retrieval.lexical): bm25s's own scores, identifier splitting, the on-disk index cache and its damage,
sub-registry search, and the retrievers' PtR merge."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.data import make_data_dir

from evaluator.core.cache_layout import CacheLayout
from evaluator.data import load_registry
from evaluator.retrieval import lexical as L
from evaluator.retrieval import ranking
from evaluator.retrieval.retrievers import Hybrid, Lexical

bm25s = pytest.importorskip("bm25s")


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return load_registry(make_data_dir(tmp_path_factory.mktemp("d")), "full").texts()


QUERIES = ["transfer history of a football player", "get_player_transfers: who did Messi play for",
           "weatherForecast for Paris", "zzz qqq"]


def test_scores_are_bm25s_own(texts: list[str]) -> None:
    idx = L.BM25Index.build(texts)
    model = bm25s.BM25(method=L.METHOD, k1=L.K1, b=L.B)
    model.index(L.tokenize(texts), show_progress=False)
    scores, rows = idx.search(QUERIES, len(texts))
    for q, s, r in zip(QUERIES[:3], scores, rows, strict=False):
        toks = L.tokenize([q])[0]
        ref = model.get_scores(toks)
        assert s == pytest.approx(ref[r], abs=1e-5)  # float64 here, float32 in bm25s
        # best first; ties (and the zero-score tail) to the higher registry row
        assert all((a > b) or (a == b and ra > rb) for a, b, ra, rb in zip(s, s[1:], r, r[1:], strict=False))
    # no token of "zzz qqq" is in the registry: bm25s scores every API 0, we find nothing (not the rows in order)
    assert not model.get_scores(L.tokenize([QUERIES[3]])[0]).any()
    assert (rows[3] == L.NO_HIT).all() and np.isneginf(scores[3]).all()


def test_a_text_with_no_registry_token_retrieves_nothing_and_is_counted(texts: list[str]) -> None:
    told: list[str] = []
    lex = Lexical(L.BM25Index.build(texts), told.append)
    found = ranking.from_hits(lex.search(["zzz qqq", "football player transfers", "the and of"], 5))
    assert found[0].rows == [] and found[0].scores == [] and found[2].rows == []  # stop words only: no token
    assert len(found[1].rows) == 5 and texts[found[1].rows[0]].startswith("Football Data/player transfers")
    assert told == ["zzz qqq", "the and of"]
    # a stub that matches nothing adds nothing to PtR's merge; the other stub's hits stand alone
    s, r = lex.search(["zzz qqq", "football player transfers"], 5)
    merged = ranking.ptr_from_hits(s, r, [0, 0], 1, 5, [1, 5])[0]
    assert merged.rows == found[1].rows and merged.stub_rows[0] == [] and merged.width == {1: 1, 5: 5}
    assert ranking.ptr_rows(s, r, [0, 0], 1, 5) == [found[1].rows]
    # hybrid: the dense list alone ranks a text BM25 found nothing for (no NO_HIT row survives the fusion)
    dense = np.tile(np.arange(len(texts))[None, :], (2, 1))
    fused = ranking.from_hits(Hybrid(_SameRows(dense), lex).search(["zzz qqq", "football player transfers"], 5))
    assert fused[0].rows == list(range(5)) and all(x >= 0 for f in fused for x in f.rows)


class _SameRows:
    """A retriever that returns the same rows for every text."""

    name = "dense"

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows

    def search(self, texts: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        r = self.rows[: len(texts), :k]
        return -np.arange(r.shape[1], dtype=float)[None, :].repeat(len(texts), 0), r


def test_identifiers_are_split(texts: list[str]) -> None:
    assert L.tokenize(["get_player_transfers getPlayerTransfers HTTPServer"]) == [
        ["get", "player", "transfers", "get", "player", "transfers", "http", "server"]]
    idx = L.BM25Index.build(texts)
    _, rows = idx.search(["get_player_transfers"], 1)
    assert texts[rows[0][0]].startswith("Football Data/player transfers")


def test_subregistry_search_filters_the_full_ranking(texts: list[str]) -> None:
    idx = L.BM25Index.build(texts)
    full_s, full_r = idx.search(QUERIES[:3], len(texts))
    sub = np.array([0, 3, 6, 7, 9, 12])
    s, r = idx.search(QUERIES[:3], 4, sub)
    for q in range(3):
        keep = [(x, y) for x, y in zip(full_r[q], full_s[q], strict=True) if x in set(sub.tolist())][:4]
        assert r[q].tolist() == [x for x, _ in keep] and s[q] == pytest.approx([y for _, y in keep])


def test_index_cache_is_reused_and_a_damaged_file_rebuilt(texts: list[str], tmp_path) -> None:
    warned: list[str] = []
    a, built = L.load_index(texts, tmp_path, warned.append)
    assert built and not warned
    (f,) = (CacheLayout(tmp_path).bm25).glob("*.npz")
    b, built = L.load_index(texts, tmp_path, warned.append)
    assert not built and not warned
    assert np.array_equal(a.search(QUERIES, 5)[1], b.search(QUERIES, 5)[1])
    # another registry (one text changed) is another file
    _, built = L.load_index([*texts[:-1], texts[-1] + " changed"], tmp_path)
    assert built and len(list((CacheLayout(tmp_path).bm25).glob("*.npz"))) == 2
    for damage in (lambda d: d[: len(d) // 2], lambda d: d[:-200] + bytes(200) if len(d) > 400 else d):
        raw = f.read_bytes()
        f.write_bytes(damage(raw))
        c, built = L.load_index(texts, tmp_path, warned.append)
        assert built and "damaged BM25 index" in warned[-1]
        assert np.array_equal(c.search(QUERIES, 5)[1], a.search(QUERIES, 5)[1])
    assert list((CacheLayout(tmp_path).bm25).glob("*.damaged"))


def test_checksum_catches_a_changed_weight(texts: list[str], tmp_path) -> None:
    L.load_index(texts, tmp_path)
    (f,) = (CacheLayout(tmp_path).bm25).glob("*.npz")
    with np.load(f) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["data"] = arrays["data"].copy()
    arrays["data"][0] += 1.0  # a readable file whose content changed
    np.savez(f, **arrays)
    warned: list[str] = []
    _, built = L.load_index(texts, tmp_path, warned.append)
    assert built and "checksum" in warned[0]


class _Fixed:
    """A stand-in retriever with given lists (to check fusion and the PtR merge without embedding)."""

    name = "fixed"

    def __init__(self, rows: dict[str, list[int]]) -> None:
        self.rows = rows

    def search(self, texts, k):
        rows = np.array([self.rows[t][:k] for t in texts], np.int64).reshape(len(texts), -1)
        return np.ones(rows.shape) / (1 + np.arange(rows.shape[1])), rows


def test_hybrid_fuses_and_ptr_merges_by_the_retrievers_score(texts: list[str]) -> None:
    dense = _Fixed({"a": [1, 2, 3, 4], "b": [5, 6, 7, 8]})
    lexical = _Fixed({"a": [2, 1, 9, 10], "b": [11, 5, 12, 13]})
    scores, rows = Hybrid(dense, lexical, depth=4).search(["a", "b"], 3)
    # 3 and 9 tie at rank 3 of one list each: the higher row first
    assert rows[0].tolist() == [2, 1, 9] and scores[0][0] == pytest.approx(1 / 61 + 1 / 62)
    assert rows[1].tolist() == [5, 11, 6]
    # PtR with stubs "a" and "b": the best RRF score any stub gives an API
    (merged,) = ranking.ptr_from_hits(scores, rows, [0, 0], 1, 3, [1, 3])
    assert merged.rows == [5, 2, 1] and merged.width == {1: 2, 3: 6}  # ties to the higher row
    lex = Lexical(L.BM25Index.build(texts))
    s, r = lex.search(QUERIES[:2], 3)
    (one,) = ranking.ptr_from_hits(s, r, [0, 0], 1, 3, [3])
    best = {}
    for row_list, score_list in zip(r, s, strict=True):
        for x, y in zip(row_list, score_list, strict=True):
            best[x] = max(best.get(x, 0.0), y)
    assert one.scores == pytest.approx(sorted(best.values(), reverse=True)[:3])
