"""Start-up: heavy packages load only where they are used. torch and sentence-transformers only when
a model must run (or CUDA may exist), matplotlib only when a figure is drawn, scipy.stats only when
a statistical test is computed. Checked in a fresh interpreter, where `sys.modules` tells what was
imported."""

from __future__ import annotations

from pathlib import Path

from helpers import REPO
from helpers.procs import PYTHON, run

HEAVY = ("torch", "sentence_transformers", "transformers", "matplotlib", "scipy.stats")


def _loaded_after(code: str, tmp_path: Path) -> list[str]:
    probe = code + f"\nimport sys\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    p = run([PYTHON, "-c", probe], cwd=tmp_path, timeout=300,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})  # nothing else inherited
    assert p.returncode == 0, p.stderr[-2000:]
    return eval(p.stdout.strip().splitlines()[-1])  # noqa: S307 - our own probe's printed list


def test_the_command_line_loads_no_heavy_package(tmp_path: Path) -> None:
    assert _loaded_after("import evaluator.cli.main, evaluator.app.run_study", tmp_path) == []


def test_a_fully_cached_embedding_loads_no_model(tmp_path: Path) -> None:
    """device 'auto' on a machine without a GPU device node, every text in the cache: no torch."""
    code = f"""
import numpy as np
from pathlib import Path
import evaluator.retrieval.embed as E
E._GPU_NODES = ()  # as on a machine without a GPU, whatever this one has
texts = ["get weather: forecast by city", "convert currency: rates"]
first = E.Embedder(cache_dir=Path({str(tmp_path / 'cache')!r}), progress=False)
assert first.device == "cpu"
first.store.add([E._key(t) for t in texts], np.eye(2, 8, dtype=np.float32))
again = E.Embedder(cache_dir=Path({str(tmp_path / 'cache')!r}), progress=False)
assert again.encode(texts).shape == (2, 8)
"""
    assert _loaded_after(code, tmp_path) == []
