"""Libraries loaded through the evaluator, in a fresh process pinned to one CPU, wait passively on the CPUs it
may use (OpenMP's wait policy, torch's and faiss's thread counts)."""

from __future__ import annotations

import os

import pytest
from helpers.procs import PYTHON, child_env, run


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_libraries_loaded_through_the_evaluator_wait_passively_on_the_allowed_cpus():
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
        "import evaluator.retrieval.index, torch, faiss;"
        "from evaluator.core import threads; threads.configure_torch();"
        "print(os.environ['OMP_WAIT_POLICY'], torch.get_num_threads(), faiss.omp_get_max_threads())"
    )
    env = child_env({"OMP_WAIT_POLICY": None, "OMP_NUM_THREADS": None, "EVALUATOR_THREADS": None})
    out = run([PYTHON, "-c", code], env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["PASSIVE", "1", "1"]
