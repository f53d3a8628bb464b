"""An exported embedding path in a fresh process embeds new texts without importing torch or
sentence-transformers, to torch's vectors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.procs import PYTHON, run

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
