"""The cache folder's layout (`--cache-dir`, default `cache/`): every folder under it, named once.

    cache/
      embeddings/<model>/<path>/   embedding shards per model and runtime path (embed.EmbeddingStore)
      exports/<model>/<kind>/      ONNX / OpenVINO exports of the embedding model (embed_backends)
      searches/                    kept searches of sub-registries and stubs (index.SearchMemo, SubsetSearch)
      llm/                         the response cache (llm.cache.ResponseCache), with
        claims/                    who is sending which call right now (processes sharing the cache)
        rate/                      shared RPM/TPM pacing, unless --rate-dir names another (llm.limits)
      batch/                       the record of submitted batches (batch.store.JobStore)
      figures/                     figures already drawn, by their data (render.figures)

Every folder is safe to delete: what was in it is computed (or, for `llm/` and `batch/`, paid for) again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CacheLayout:
    root: Path

    @property
    def embeddings(self) -> Path:
        return Path(self.root) / "embeddings"

    @property
    def exports(self) -> Path:
        return Path(self.root) / "exports"

    @property
    def searches(self) -> Path:
        return Path(self.root) / "searches"

    @property
    def llm(self) -> Path:
        return Path(self.root) / "llm"

    @property
    def claims(self) -> Path:
        return self.llm / "claims"

    @property
    def rates(self) -> Path:
        return self.llm / "rate"

    @property
    def batch(self) -> Path:
        return Path(self.root) / "batch"

    @property
    def figures(self) -> Path:
        return Path(self.root) / "figures"
