"""Benchmark results that say what they measured (issue 42): every file of bench/results/ carries its stamp (the
commit and whether the tree was dirty, the host's CPU, the load), bench/README.md's results block is exactly what
those files render, and `python -m bench --check` tells a result older than the code it measures. Structure and
git history only: nothing here times anything."""

from __future__ import annotations

import inspect

from bench import check, readme
from bench.common import BENCH
from bench.workload import TableBatcher
from evaluator.study.runner import StubBatcher


def test_every_result_file_records_what_it_measured():
    files = check.result_files()
    assert files, "bench/results/ holds no result"
    problems = [p for f in files for p in check.structure_problems(f)]
    assert not problems, "\n".join(problems)
    assert all(check.module_of(f) for f in files), "a result file whose benchmark module is gone"
    assert all(check.measures(check.module_of(f) or "") for f in files), "a benchmark that does not say what it measures"


def test_the_readme_block_is_what_the_results_render():
    text = (BENCH / "README.md").read_text(encoding="utf-8")
    assert readme.readme_block(text) == readme.block(), (
        "bench/README.md's results block differs from bench/results/*.json: run "
        "`python -c 'from bench.readme import update_readme; update_readme()'`")


def test_the_benches_stand_ins_keep_the_pipelines_signatures() -> None:
    # bench fanout's TableBatcher answers StubBatcher's searches from a table: a change to the method it replaces
    # (issue 36 added the retriever's name) broke the bench with no test noticing
    ours, theirs = inspect.signature(TableBatcher._search), inspect.signature(StubBatcher._search)
    assert list(ours.parameters) == list(theirs.parameters), (ours, theirs)
