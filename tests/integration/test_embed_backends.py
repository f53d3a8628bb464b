"""An exported embedding path in a fresh process embeds new texts without importing torch or
sentence-transformers, to torch's vectors."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from helpers.procs import PYTHON, run

from evaluator.retrieval import backends
from evaluator.retrieval.embed import Embedder

TEXTS = [
    "Flight Search/search flights: find flights between two airports on a date",
    "Weather/current: the current weather for a city",
    "x",
]


def test_an_exported_path_embeds_new_texts_without_importing_torch(tmp_path):
    """A run whose export exists (every run after the first) tokenises with the export's own
    tokenizer: new texts are embedded without torch or sentence-transformers, to the same vectors.
    (The fresh cache folder links the export this session already built: EVALUATOR_SHARED_EXPORTS.)"""
    pytest.importorskip("openvino")
    Embedder(backend="openvino", precision="fp32", cache_dir=tmp_path / "first", progress=False).encode(TEXTS[:1])
    texts = ["  Leading spaces: Café NAÏVE  ", "", "tab\tnew\nline", "word " * 400, *TEXTS[1:]]
    script = (
        "import json, sys\n"
        "from evaluator.retrieval.embed import Embedder\n"
        "from pathlib import Path\n"
        f"e = Embedder(backend='openvino', precision='fp32', cache_dir=Path({str(tmp_path / 'fresh')!r}), progress=False)\n"
        f"v = e.encode({texts!r})\n"
        "print(json.dumps({'vecs': v.tolist(), 'embedded': e.stats.embedded, 'load': e.stats.model_load_s,\n"
        "                  'torch': 'torch' in sys.modules,\n"
        "                  'st': 'sentence_transformers' in sys.modules}))\n"
    )
    out = run([PYTHON, "-c", script], timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["embedded"] == len(texts) and not got["torch"] and not got["st"] and got["load"] == 0
    ref = Embedder(backend="torch", precision="fp32", cache_dir=None, progress=False).encode(texts)
    assert np.abs(np.array(got["vecs"]) - ref).max() < 1e-5


def test_an_export_another_process_is_building_is_waited_for_not_built_again(tmp_path, monkeypatch):
    # two studies started together on one cache (the suite's two workers on the shared exports): one build
    # (in tests/integration: filelock polls with a sleep)
    built: list[str] = []
    monkeypatch.delenv(backends.SHARED_EXPORTS_ENV, raising=False)  # this cache folder's own
    monkeypatch.setattr(backends, "_build_in_child", lambda *a: built.append(a[2]) or {})
    final = backends._folder(tmp_path, "m", "m", "onnx-fp32")
    final.parent.mkdir(parents=True)
    waiting = threading.Event()
    real = backends.FileLock

    class Seen(real):  # type: ignore[misc, valid-type]
        def acquire(self, *a, **k):
            waiting.set()
            return super().acquire(*a, **k)

    monkeypatch.setattr(backends, "FileLock", Seen)
    other = real(final.parent / f".{final.name}.lock")  # another process, building it
    other.acquire()
    done: list[object] = []
    t = threading.Thread(target=lambda: done.append(backends.export(lambda: None, "m", "m", "onnx-fp32", tmp_path)))
    t.start()
    assert waiting.wait(30)  # it asked for the lock the other holds...
    final.mkdir()  # ...the other's build lands, and it lets go
    other.release()
    t.join(30)
    assert done == [final] and built == []  # found built, not built again
