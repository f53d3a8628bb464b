"""The embedder's GPU path, checked where it can be without a GPU: the cache keeps a GPU's vectors apart, token
ids fed to the model give `SentenceTransformer.encode`'s vectors, a GPU's batches are large and length-sorted, and a
model folder saved in half precision (what travels to the GPU machine) embeds in fp32 when fp32 is asked."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from evaluator.retrieval.embed import Embedder, gpu_peak_mib, resolve_model

TEXTS = ["get weather: forecast by city", "convert currency: rates", "x", "",
         "Football Manager Career History: the clubs a manager coached, with dates and results " * 6,
         "Émile's café: NAÏVE über-Straße", "emoji 😀 and 中文"]


def test_a_gpu_path_has_cache_folders_of_its_own(tmp_path: Path) -> None:
    """Constructing an embedder loads no model (and no CUDA): the folders follow from the settings alone."""
    def key(device: str, precision: str = "auto") -> str:
        e = Embedder(device=device, backend="torch", precision=precision, cache_dir=tmp_path, progress=False)
        assert e.store is not None and e.store.root.name == e.path_key
        return e.path_key

    assert key("cpu", "fp32") == "fp32" and key("cpu", "bf16") == "bf16"  # as before: old caches stay valid
    assert key("cuda") == "cuda-fp16"  # auto on a GPU: torch fp16
    assert key("cuda:1", "fp32") == "cuda-fp32" and key("cuda", "bf16") == "cuda-bf16"
    assert Embedder(device="cuda", backend="torch", progress=False).feed_ids
    assert not Embedder(device="cpu", backend="torch", progress=False).feed_ids
    assert gpu_peak_mib("cpu") is None


def test_token_ids_fed_to_the_model_give_encodes_vectors() -> None:
    plain = Embedder(device="cpu", backend="torch", precision="fp32", progress=False, batch_size=3)
    fed = Embedder(device="cpu", backend="torch", precision="fp32", progress=False, batch_size=3)
    fed.feed_ids = True  # what a GPU does: the ids of the one tokenisation, padded per batch
    want, got = plain.encode(TEXTS), fed.encode(TEXTS)
    assert np.allclose(want, got, atol=1e-6)
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)


def test_a_gpu_takes_large_length_sorted_batches() -> None:
    e = Embedder(device="cpu", backend="torch", precision="fp32", progress=False, batch_size=128)
    lengths = np.array([300] * 10 + [40] * 20_000 + [5] * 10_000)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    cpu = list(e._batches(order, lengths))
    e.device = "cuda"  # only the batching is asked: nothing runs
    gpu = list(e._batches(order, lengths))
    assert max(map(len, cpu)) == 128 and len(gpu) < len(cpu) / 10
    assert [i for b in gpu for i in b] == order  # every text once, longest first
    assert all(len(b) * lengths[b[0]] <= 1 << 17 for b in gpu)  # padded tokens bounded
    assert max(map(len, gpu)) == 8192


def test_a_half_precision_model_folder_embeds_in_fp32_when_asked(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    src = Path(resolve_model("bundled:all-MiniLM-L6-v2")[0])
    half = tmp_path / "half"
    shutil.copytree(src, half, ignore=shutil.ignore_patterns("model.safetensors", "*.md", "data_config.json"))
    weights = load_file(src / "model.safetensors")
    save_file({k: v.half() if v.is_floating_point() else v for k, v in weights.items()}, str(half / "model.safetensors"))
    e = Embedder(str(half), device="cpu", backend="torch", precision="fp32", progress=False)
    got = e.encode(TEXTS)
    assert next(e.model.parameters()).dtype.is_floating_point and str(next(e.model.parameters()).dtype) == "torch.float32"
    want = Embedder(device="cpu", backend="torch", precision="fp32", progress=False).encode(TEXTS)
    assert (got * want).sum(axis=1).min() > 0.9999  # only the weights' rounding to fp16 differs
