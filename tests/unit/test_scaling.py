"""Scaling study on a tiny synthetic output folder: sub-registries, seeds, outputs, no network.

Embeddings come from a hashed bag of words (fast, deterministic, and texts sharing words are close),
either injected or written into the embedding cache the real Embedder reads.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from helpers.records import flat

from evaluator.analysis import scaling_study as S
from evaluator.app.outputs import SCALING_FILE, render_outputs
from evaluator.cli.main import main as cli
from evaluator.data import load_registry
from evaluator.results.plans import Stub, stub_text
from evaluator.results.schema import OutputDir
from evaluator.retrieval import ranking
from evaluator.retrieval.embed import Embedder, _key
from evaluator.retrieval.index import SubsetSearch, VectorIndex

DIM = 48
CATEGORIES = {"Sports": 120, "Finance": 60, "Weather": 30, None: 90}  # None: no category
K = 5


def fake_encode(texts: list[str]) -> np.ndarray:
    out = np.zeros((len(texts), DIM), np.float32)
    for i, t in enumerate(texts):
        for w in t.lower().replace("/", " ").replace(":", " ").replace("_", " ").split():
            seed = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "big")
            out[i] += np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
        out[i] += 1e-3  # an empty text still has a direction
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def _registry_lines() -> list[dict]:
    lines = []
    for cat, n in CATEGORIES.items():
        for i in range(n):
            tool = f"{cat or 'Misc'}Tool{i // 5}"
            lines.append({"tool_name": tool, "api_name": f"{cat or 'misc'} thing{i}", "category": cat,
                          "api_description": f"{cat or 'misc'} word{i % 17} alpha{i % 7} beta{i}"})
    return lines


def make_output(tmp_path: Path, *, g2_gold: int = 5, runs: int = 2) -> Path:
    """A finished output folder whose saved retrieval was computed with `fake_encode`."""
    data = tmp_path / "data"
    (data / "registry").mkdir(parents=True)
    with open(data / "registry" / "apis.jsonl", "w") as fh:
        for line in _registry_lines():
            fh.write(json.dumps(line) + "\n")
    reg = load_registry(data)
    api_vecs = fake_encode(reg.texts())
    index = VectorIndex(api_vecs)
    rng = np.random.default_rng(7)
    queries = []
    for subset, n, n_gold in (("G1_instruction", 8, 2), ("G2_instruction", 6, g2_gold), ("G3_instruction", 4, 3)):
        for qid in range(n):
            gold = [reg.apis[int(i)] for i in rng.choice(len(reg), n_gold, replace=False)]
            text = " ".join(a.description.split()[1] + " " + a.description.split()[3] for a in gold)
            queries.append((subset, qid, text, [a.id for a in gold], [gold[0].id]))
    out = tmp_path / "out"
    out.mkdir()
    qv = fake_encode([q[2] for q in queries])
    rtp = ranking.rtp(index, qv, 20)
    records = []
    for run in range(runs):
        stubs_per_q = []
        texts, owners = [], []
        for qi, (_s, _q, text, _g, _r) in enumerate(queries):
            words = text.split()
            stubs = [Stub(f"get_{w}", f"finds {w} run{run}") for w in words[: 1 + (qi + run) % 3]]
            stubs_per_q.append(stubs)
            for st in stubs:
                texts.append(stub_text(st))
                owners.append(qi)
        ptr = ranking.ptr(index, fake_encode(texts), owners, len(queries), 20, [1, 5, 20])
        for qi, (subset, qid, text, api_list, relevant) in enumerate(queries):
            records.append({
                "model": "sim", "run": run, "subset": subset, "query_id": qid, "query": text,
                "gold": {"api_list": api_list, "relevant": relevant},
                "rtp": {"retrieved": [reg.ids[r] for r in rtp[qi].rows], "scores": rtp[qi].scores, "plan": None,
                        "tokens": {"planner": {"prompt": 100, "completion": 10}}},
                "ptr": {"stubs": [{"name": s.name, "reasoning": s.reasoning} for s in stubs_per_q[qi]],
                        "discovery_parse_error": None, "discovery_llm_error": None, "fallback": False,
                        "retrieved": [reg.ids[r] for r in ptr[qi].rows], "scores": ptr[qi].scores, "plan": None,
                        "tokens": {"discovery": {"prompt": 50, "completion": 30},
                                   "planner": {"prompt": 100, "completion": 10}}},
            })
    with open(out / "queries.jsonl", "w") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    meta = {"data_dir": str(data), "registry": {"choice": "full", "size": len(reg)}, "k": K, "ks": [1, 5, 20],
            "embedder": "sentence-transformers/all-MiniLM-L6-v2", "precision": "fp32", "simulated": True,
            "models": [{"name": "sim", "simulated": True}], "runs": runs,
            "settings": {"embedder": "bundled:all-MiniLM-L6-v2", "cache_dir": str(tmp_path / "cache"),
                         "precision": "auto"}}
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def run_scaling(out: Path, *, sizes: list[int], seeds: int, subsets: tuple[str, ...] = ("G1_instruction", "G2_instruction"),
                divergence: str = "G1_instruction") -> dict:
    """The study as the app runs it after a study, with `fake_encode` for every vector; returns scaling.json."""
    od = OutputDir(out)
    meta = od.read_meta()
    reg = load_registry(meta.data_dir)
    res = S.scaling_study(od.read_records(), reg, fake_encode(reg.texts()), fake_encode, subsets=list(subsets),
                          divergence_subset=divergence, k=K, sizes=sizes, seeds=seeds,
                          about={"embedder": meta.embedder, "precision": meta.precision, "registry_choice": "full",
                                 "simulated_models": meta.simulated_models})
    od.write_json(SCALING_FILE, res.to_dict())
    render_outputs(od, with_figures=True)
    return json.loads((out / SCALING_FILE).read_text())


# ---------------------------------------------------------------- sub-registries


def _pool_and_gold(tmp_path: Path):
    out = make_output(tmp_path)
    reg = load_registry(json.loads((out / "meta.json").read_text())["data_dir"])
    gold = np.array([0, 1, 130, 200, 250], dtype=np.int64)
    return reg, S.strata([a.category for a in reg.apis], gold), gold


def test_same_seed_same_subregistry_and_gold_always_in(tmp_path: Path) -> None:
    reg, pool, gold = _pool_and_gold(tmp_path)
    a = S.sample_subregistry(pool, gold, 100, S.seed_rng(3, 100))
    b = S.sample_subregistry(pool, gold, 100, S.seed_rng(3, 100))
    c = S.sample_subregistry(pool, gold, 100, S.seed_rng(4, 100))
    assert np.array_equal(a.rows, b.rows)
    assert not np.array_equal(a.rows, c.rows)
    for sub in (a, c):
        assert len(sub.rows) == 100 == len(set(sub.rows.tolist()))
        assert set(gold.tolist()) <= set(sub.rows.tolist())
        assert not sub.gold_only


def test_distractors_proportional_to_category_sizes(tmp_path: Path) -> None:
    reg, pool, gold = _pool_and_gold(tmp_path)
    sub = S.sample_subregistry(pool, gold, 155, S.seed_rng(0, 155))  # 150 distractors out of a 295 pool
    distractors = [r for r in sub.rows.tolist() if r not in set(gold.tolist())]
    got = Counter(reg.apis[r].category or S.NO_CATEGORY for r in distractors)
    pool_sizes = {name: len(rows) for name, rows in pool}
    total = sum(pool_sizes.values())
    for name, size in pool_sizes.items():
        assert abs(got[name] - 150 * size / total) < 1, (name, got[name])
    assert got[S.NO_CATEGORY] > 0  # APIs without a category are a stratum of their own
    assert dict(got) == sub.per_stratum


def test_gold_only_when_gold_reaches_the_size(tmp_path: Path) -> None:
    reg, pool, gold = _pool_and_gold(tmp_path)
    sub = S.sample_subregistry(pool, gold, 4, S.seed_rng(0, 4))
    assert sub.gold_only and sorted(sub.rows.tolist()) == sorted(gold.tolist())


def test_allocate_is_exact_and_bounded() -> None:
    assert S.allocate([120, 60, 30, 90], 100) == [40, 20, 10, 30]
    assert sum(S.allocate([7, 3, 1], 5)) == 5
    assert S.allocate([2, 1], 10) == [2, 1]


# ---------------------------------------------------------------- the study


def test_study_reproducible_and_flags_gold_only(tmp_path: Path, no_network: None) -> None:
    out = make_output(tmp_path, g2_gold=12)  # G2's gold union (<= 72 APIs) exceeds the 50 target
    first = run_scaling(out, sizes=[50, 150], seeds=3)
    second = run_scaling(out, sizes=[50, 150], seeds=3)
    assert first["rows"] == second["rows"]  # same seeds, same sub-registries, same numbers

    points = {(p["subset"], p["size"]): p for p in first["points"]}
    g2_gold = first["meta"]["gold_union"]["G2_instruction"]["in_registry"]
    assert g2_gold > 50
    assert points[("G2_instruction", 50)]["gold_only"] and points[("G2_instruction", 50)]["n_apis"] == [g2_gold]
    assert not points[("G1_instruction", 50)]["gold_only"]
    assert points[("G1_instruction", 150)]["n_apis"] == [150, 150, 150]
    assert points[("G1_instruction", "full")]["n_apis"] == [300]

    rows = {(r["subset"], r["size"], r["arch"], r["metric"], r["gold"]): r for r in first["rows"]}
    assert rows[("G2_instruction", 50, "rtp", "recall", "api_list")]["std"] is None
    assert len(rows[("G1_instruction", 150, "ptr", "recall", "api_list")]["values"]) == 3  # one per seed
    assert rows[("G1_instruction", "full", "both", "divergent", None)]["std"] is None
    # Smaller registries are easier: recall at 50 APIs is at least the full registry's.
    assert (rows[("G1_instruction", 50, "rtp", "recall", "api_list")]["mean"]
            >= rows[("G1_instruction", "full", "rtp", "recall", "api_list")]["mean"])

    # The full point reproduces the run's own retrieval (same vectors), and its recall matches the records.
    assert first["full_registry_check"]["G1_instruction"] == {"rtp_same_topk": 1.0, "ptr_same_topk": 1.0}
    recs = [flat(json.loads(line)) for line in (out / "queries.jsonl").read_text().splitlines()]
    g1 = {r["query_id"]: r for r in recs if r["subset"] == "G1_instruction" and r["run"] == 0}
    expect = np.mean([len(set(r["rtp"]["retrieved"][:K]) & set(r["gold"]["api_list"])) / len(r["gold"]["api_list"])
                      for r in g1.values()])
    assert rows[("G1_instruction", "full", "rtp", "recall", "api_list")]["mean"] == pytest.approx(expect)

    md = (out / "report.md").read_text()
    assert "gold-only" in md and "SIMULATED LLM" in md and "G1_instruction Div%" in md and "`sim`" in md
    assert (out / "figures" / "scaling.png").stat().st_size > 1000
    assert json.loads((out / "scaling.json").read_text())["meta"]["seeds"] == 3


def test_cli_reads_the_embedding_cache_and_embeds_nothing(tmp_path: Path, no_network: None) -> None:
    out = make_output(tmp_path)
    meta = json.loads((out / "meta.json").read_text())
    recs = [flat(json.loads(line)) for line in (out / "queries.jsonl").read_text().splitlines()]
    texts = load_registry(meta["data_dir"]).texts() + [r["query"] for r in recs]
    texts += [stub_text(Stub(s["name"], s["reasoning"])) for r in recs for s in r["ptr"]["stubs"]]
    texts = list(dict.fromkeys(texts))
    # Fill the cache the real Embedder reads (same model name and precision as the run's meta).
    emb = Embedder(meta["settings"]["embedder"], device="cpu", precision="fp32", cache_dir=tmp_path / "cache")
    assert emb.store is not None
    emb.store.add([_key(t) for t in texts], fake_encode(texts))

    assert cli(["scaling", str(out), "--sizes", "60,120", "--seeds", "2", "--subsets", "G1,G2",
                "--device", "cpu", "--no-progress"]) == 0
    res = json.loads((out / "scaling.json").read_text())
    assert res["meta"]["embed"]["embedded"] == 0
    assert res["meta"]["embed"]["cache_hits"] > 0
    assert res["full_registry_check"]["G2_instruction"]["ptr_same_topk"] == 1.0
    assert {p["subset"] for p in res["points"]} == {"G1_instruction", "G2_instruction"}
    assert "## Scaling study (Table 10)" in (out / "report.md").read_text() and (out / "figures" / "scaling.png").is_file()


def test_not_an_output_folder_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["scaling", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "queries.jsonl" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- one search for every sub-registry


def _tied_registry(rng: np.random.Generator, n: int = 400, dim: int = 6) -> np.ndarray:
    """Low-dimensional unit vectors (many near-ties) where a fifth of the rows are exact copies of
    other rows, as APIs whose texts differ only in case are: ties the search must order as FAISS does."""
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    copies = rng.choice(n, n // 5, replace=False)
    vecs[copies] = vecs[rng.choice(n, n // 5, replace=False)]
    return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


@pytest.mark.parametrize("smallest", [20, 400])  # deep prefix; shallow one, so most subsets are searched directly
def test_subset_search_equals_an_index_per_subregistry(smallest: int) -> None:
    rng = np.random.default_rng(3)
    api = _tied_registry(rng)
    # Queries on top of registry vectors (and their copies), so ties fall at the top-k boundary.
    queries = np.concatenate([api[rng.choice(len(api), 30)] + 0.05 * rng.standard_normal((30, api.shape[1])),
                              api[rng.choice(len(api), 10)]]).astype(np.float32)
    queries = np.concatenate([queries, queries[:5]])  # repeated vectors (a stub in every run) are searched once
    one = VectorIndex(api)
    prefix = SubsetSearch(api, queries, K, smallest)
    tied = 0
    for size in (20, 60, 150, 400):
        for _draw in range(4):
            rows = np.sort(rng.choice(len(api), size, replace=False))
            old_scores, old_rows = VectorIndex(api, rows=rows).exact_search(queries, K)
            new_scores, new_rows = prefix.search(rows, K)
            assert new_rows.tolist() == old_rows.tolist()
            assert np.array_equal(new_scores, old_scores)
            tied += int(np.sum(old_scores[:, :-1] == old_scores[:, 1:]))
    assert tied > 0  # the case that matters was exercised
    assert prefix.search(np.arange(len(api)), K)[1].tolist() == one.exact_search(queries, K)[1].tolist()


def test_scaling_points_equal_a_search_per_subregistry(tmp_path: Path) -> None:
    """Every point's top-k lists, RtP and PtR, as an index over each sub-registry gives them."""
    out = make_output(tmp_path)
    od = OutputDir(out)
    reg = load_registry(od.read_meta().data_dir)
    api = fake_encode(reg.texts())
    for si in S.build_inputs(od.read_records(), reg, ["G1_instruction", "G2_instruction"], fake_encode, K):
        found = S.searcher(api, si, K, 50)
        pool = S.strata([a.category for a in reg.apis], si.gold_rows)
        for size, seed in ((50, 0), (50, 1), (150, 2), (len(reg), 0)):
            sub = S.sample_subregistry(pool, si.gold_rows, size, S.seed_rng(seed, size))
            index = VectorIndex(api, rows=sub.rows)
            n = len(si.query_ids)
            expect_rtp = [r.rows for r in ranking.rtp(index, si.query_vecs, K)]
            expect_ptr = [r.rows for r in ranking.ptr(index, si.stub_vecs, si.owners, len(si.units) * n, K, [K])]
            got = S.search(found, si, sub.rows, K)
            assert got.rtp == expect_rtp
            assert got.ptr == expect_ptr


def test_ptr_rows_equals_the_run_s_ptr_ranking() -> None:
    """The scaling study's array version of PtR's union and re-ranking, on scores with many ties
    (the same API hit by several stubs, equal scores across APIs)."""
    rng = np.random.default_rng(5)
    n_stubs, n_queries = 300, 80
    rows = rng.integers(0, 40, (n_stubs, K))
    scores = np.round(rng.random((n_stubs, K)), 1)  # tenths: ties everywhere
    owners = sorted(rng.integers(0, n_queries, n_stubs).tolist())  # some queries have no stub
    expect = [r.rows for r in ranking.ptr_from_hits(scores, rows, owners, n_queries, K, [K])]
    assert ranking.ptr_rows(scores, rows, owners, n_queries, K) == expect
    assert any(not e for e in expect)
