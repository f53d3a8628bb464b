"""Benchmark: the first run's embedding with `bundled:all-mpnet-base-v2` beside the default all-MiniLM-L6-v2.

Each embedder starts from an empty cache folder, as a fresh clone's first run does: mpnet's five PyPI pieces
joined and checked, the model exported and compiled for the default backend (`auto`), then a stride sample of
what a first run embeds (the registry's texts and the test queries, every k-th in token order, so the sample
has the registry's length distribution). Reported per embedder: the whole first run on the sample (wall),
where it went (assembly + load, export, tokenising, forward passes, from `EmbedStats`), and the ratio of
mpnet's forward-pass seconds to MiniLM's on the same texts; with `--full-minilm-s` (the forward-pass seconds
of a measured full first run with MiniLM, as `meta.json`'s `runtime.embed.infer_s` says) it projects mpnet's
full first run by that ratio. Needs the `mpnet` extra. The embedders run one after the other, in one process.

    python -m bench.embed_models [--texts 3000] [--full-minilm-s 164.2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import Goal, Result, Stamp, finish
from .embed_first_run import _texts

NAME = "embed_models"
MEASURES = ("evaluator/retrieval", "evaluator/core/threads.py", "bench/embed_models.py")  # the code it measures (`python -m bench --check`)
TITLE = "First run's embedding: bundled all-mpnet-base-v2 beside all-MiniLM-L6-v2 (fresh caches, same texts)"
MODELS = ("sentence-transformers/all-MiniLM-L6-v2", "bundled:all-mpnet-base-v2")


def _sample(texts: list[str], n: int) -> list[str]:
    order = sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))  # characters: a tokenizer-free order
    take = min(n, len(order))
    return [texts[order[int(j * len(order) / take)]] for j in range(take)]


def run(n_texts: int, full_minilm_s: float | None) -> Result:
    from evaluator.retrieval.embed import Embedder

    sample = _sample(_texts(), n_texts)
    rows: list[list[Any]] = []
    per: dict[str, dict[str, float]] = {}
    dims: dict[str, int] = {}
    for model in MODELS:
        with tempfile.TemporaryDirectory(prefix="bench-embed-models-") as tmp:
            t0 = time.perf_counter()
            e = Embedder(model, cache_dir=Path(tmp), progress=False)
            vecs = e.encode(sample)
            wall = time.perf_counter() - t0
            st = e.stats
            dims[model] = int(vecs.shape[1])
            assert np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-4)
            per[model] = {"wall_s": wall, "infer_s": st.infer_s, "tokenize_s": st.tokenize_s,
                          "export_s": st.export_s, "model_load_s": st.model_load_s}
            rows.append([model, round(wall, 1), round(st.model_load_s, 1), round(st.export_s, 1),
                         round(st.tokenize_s, 1), round(st.infer_s, 1), dims[model], e.description])
    small, big = MODELS
    ratio = per[big]["infer_s"] / per[small]["infer_s"]
    notes = [f"{len(sample):,} texts, a stride sample (by length) of the registry's texts and the test queries",
             f"mpnet / MiniLM forward-pass seconds on the same texts: {ratio:.2f}x; whole first run on the sample: "
             f"{per[big]['wall_s'] / per[small]['wall_s']:.2f}x",
             "all-mpnet-base-v2 is not the paper's gte-base (no gte-base ships on PyPI); the report says so"]
    data: dict[str, Any] = {"per_model": per, "texts": len(sample), "infer_ratio": ratio, "dims": dims}
    if full_minilm_s:
        fixed = per[big]["model_load_s"] + per[big]["export_s"]
        projected = full_minilm_s * ratio + fixed
        data["projected_full_mpnet_s"] = projected
        notes.append(f"projected full first run's embedding with mpnet: {full_minilm_s:.1f} s (MiniLM's measured "
                     f"forward passes, full registry) x {ratio:.2f} + {fixed:.1f} s (assembly, load, export) = "
                     f"{projected / 60:.1f} min (a projection by the ratio, not a measured full run)")
    return Result(
        name=NAME, title=TITLE,
        columns=["embedder", "first run on the sample s", "assemble + load s", "export s", "tokenise s",
                 "forward passes s", "dim", "runtime"],
        rows=rows,
        goals=[Goal("mpnet / MiniLM forward-pass seconds (a cost to state, no target)", ratio, "stated", True)],
        notes=notes, data=data,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=3000)
    ap.add_argument("--full-minilm-s", type=float, help="forward-pass seconds of a full MiniLM first run")
    a = ap.parse_args()
    t0 = time.perf_counter()
    st = Stamp()
    r = run(a.texts, a.full_minilm_s)
    finish(r, t0, st, "bench.embed_models")


if __name__ == "__main__":
    main()
