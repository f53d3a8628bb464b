"""Embedding runtime paths: cache keys per path, exports that match torch, clear errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from evaluator.core.errors import EmbedderError
from evaluator.core.progress import Reporter
from evaluator.retrieval.embed import Embedder, choose_runtime

TEXTS = [
    "Flight Search/search flights: find flights between two airports on a date",
    "Weather/current: the current weather for a city",
    "x",
    "Translate/translate text: translate a text from one language into another, keeping the formatting "
    "and the named entities as they are, for any pair of the hundred supported languages",
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")  # one export per module: exporting takes seconds


def test_switching_path_never_reuses_another_paths_vectors(cache):
    pytest.importorskip("onnxruntime")
    fp32 = Embedder(backend="torch", precision="fp32", cache_dir=cache, progress=False)
    ref = fp32.encode(TEXTS)
    assert fp32.stats.embedded == len(TEXTS)
    for backend, precision in (("torch", "bf16"), ("onnx", "fp32"), ("onnx", "int8")):
        other = Embedder(backend=backend, precision=precision, cache_dir=cache, progress=False)
        vecs = other.encode(TEXTS)
        assert (other.stats.cache_hits, other.stats.embedded) == (0, len(TEXTS)), (backend, precision)
        assert other.store.root != fp32.store.root
        # Same model, other runtime: close to fp32 but computed, not copied.
        assert np.all(np.sum(vecs * ref, axis=1) > 0.97)
        again = Embedder(backend=backend, precision=precision, cache_dir=cache, progress=False)
        assert np.array_equal(again.encode(TEXTS), vecs) and again.stats.embedded == 0
    back = Embedder(backend="torch", precision="fp32", cache_dir=cache, progress=False)
    assert np.array_equal(back.encode(TEXTS), ref) and back.stats.cache_hits == len(TEXTS)


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_fp32_exports_match_torch_across_batches_and_lengths(cache, backend):
    pytest.importorskip("onnxruntime" if backend == "onnx" else "openvino")
    ref = Embedder(backend="torch", precision="fp32", cache_dir=None, progress=False, batch_size=3)
    e = Embedder(backend=backend, precision="fp32", cache_dir=cache, progress=False, batch_size=3)
    texts = TEXTS + [t.upper() + " again" for t in TEXTS]  # batches of different sizes and padding
    assert np.abs(e.encode(texts) - ref.encode(texts)).max() < 1e-5
    assert backend in e.description and "fp32" in e.description
    assert next((cache / "exports").iterdir()).is_dir()  # the export is kept in the cache folder


@pytest.mark.parametrize("backend,package", [("openvino", "openvino"), ("onnx", "onnxruntime")])
def test_missing_backend_package_is_one_line_naming_the_install(monkeypatch, backend, package):
    monkeypatch.setitem(sys.modules, package, None)  # what an environment without it looks like
    with pytest.raises(EmbedderError) as err:
        Embedder(backend=backend, precision="fp32", progress=False)
    msg = str(err.value)
    assert "\n" not in msg and package in msg and f"pip install -e '.[{backend}]'" in msg


def test_auto_keeps_the_gpu_path_and_rejects_impossible_pairs():
    assert choose_runtime("auto", "auto", "cuda") == ("torch", "fp16")
    assert choose_runtime("torch", "auto", "cpu") == ("torch", "fp32")
    with pytest.raises(EmbedderError, match="has no bf16 path"):
        choose_runtime("onnx", "bf16", "cpu")
    with pytest.raises(EmbedderError, match="backend must be one of"):
        choose_runtime("tensorrt", "auto", "cpu")


def test_auto_on_cpu_takes_the_verified_path_and_falls_back_to_torch_without_it(monkeypatch):
    from evaluator.retrieval import embed

    monkeypatch.setattr(embed, "AUTO_CPU", (("onnx", "fp32"),))
    pytest.importorskip("onnxruntime")
    assert choose_runtime("auto", "auto", "cpu") == ("onnx", "fp32")
    assert choose_runtime("auto", "fp32", "cpu") == ("torch", "fp32")  # an explicit precision keeps torch
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    assert choose_runtime("auto", "auto", "cpu") == ("torch", "fp32")
    e = Embedder(cache_dir=None, progress=False)
    assert (e.backend, e.precision) == ("torch", "fp32") and e.description.startswith("torch fp32")


def test_an_export_that_fails_falls_back_to_torch_under_auto_and_is_one_line_when_chosen(
        monkeypatch, tmp_path, capsys):
    from evaluator.retrieval import backends as eb
    from evaluator.retrieval import embed

    pytest.importorskip("onnxruntime")
    monkeypatch.setattr(embed, "AUTO_CPU", (("onnx", "fp32"),))

    def broken(*a, **k):
        raise RuntimeError("cannot trace this architecture")

    monkeypatch.setattr(eb, "export", broken)
    auto = Embedder(device="cpu", cache_dir=tmp_path, progress=False, reporter=Reporter(sys.stderr))
    assert auto.backend == "onnx"
    vecs = auto.encode(TEXTS[:2])
    assert (auto.backend, auto.precision) == ("torch", "fp32") and auto.store.root.name == "fp32"
    assert "embedding with torch fp32 instead" in capsys.readouterr().err
    ref = Embedder(backend="torch", precision="fp32", cache_dir=tmp_path, progress=False)
    assert np.array_equal(ref.encode(TEXTS[:2]), vecs) and ref.stats.embedded == 0
    chosen = Embedder(backend="onnx", precision="fp32", cache_dir=tmp_path, progress=False)
    with pytest.raises(EmbedderError, match="use --backend torch") as err:
        chosen.encode(TEXTS[:2])
    assert "\n" not in str(err.value)


def test_a_tokenizer_that_does_not_match_is_not_kept(monkeypatch, tmp_path):
    """An export whose `tokenizers` form gives other ids than sentence-transformers on the probes
    keeps no tokenizer: runs tokenise through sentence-transformers, with the same vectors."""
    from evaluator.retrieval import backends as eb

    pytest.importorskip("onnxruntime")
    monkeypatch.delenv(eb.SHARED_EXPORTS_ENV, raising=False)
    monkeypatch.setattr(eb, "_BUILT", {})
    monkeypatch.setattr(eb, "ISOLATED_BUILD", False)  # the patch below must reach the build: in this process
    real = eb.TextTokenizer.features

    def off_by_one(self, ids):
        feats = real(self, ids)
        feats["input_ids"] = feats["input_ids"] + 1
        return feats

    monkeypatch.setattr(eb.TextTokenizer, "features", off_by_one)
    e = Embedder(backend="onnx", precision="fp32", cache_dir=tmp_path, progress=False)
    vecs = e.encode(TEXTS)
    folder = next((tmp_path / "exports").glob("*/onnx-fp32-*"))
    assert (folder / "model.onnx").is_file() and not (folder / eb.TOKENIZER_FILE).exists()
    assert e._tokenizer is None
    ref = Embedder(backend="torch", precision="fp32", cache_dir=None, progress=False).encode(TEXTS)
    assert np.abs(vecs - ref).max() < 1e-5


def test_openvino_streams_batches_in_their_order_and_a_stream_left_part_way_does_no_harm(cache):
    pytest.importorskip("openvino")
    from evaluator.retrieval import backends as eb

    e = Embedder(backend="openvino", precision="fp32", cache_dir=cache, progress=False)
    e.encode(["warm: the runtime is compiled"])
    run, tok = e._runner, e._tokenizer
    assert run is not None and tok is not None
    texts = TEXTS + [t.upper() + " again" for t in TEXTS]
    batches = [tok.features(tok.ids(texts[i : i + 2])) for i in range(0, len(texts), 2)]  # widths differ
    one_by_one = [run(f) for f in batches]
    streamed = list(eb.stream(run, enumerate(batches)))
    assert [k for k, _ in streamed] == list(range(len(batches)))  # in order, though two run at once
    assert all(np.abs(v - ref).max() < 1e-6 for (_, v), ref in zip(streamed, one_by_one, strict=True))
    left = eb.stream(run, enumerate(batches))
    next(left)  # its caller fails after the first batch: the others are still in flight
    eb.release(run)
    del left
    assert np.abs(run(batches[-1]) - one_by_one[-1]).max() < 1e-6
