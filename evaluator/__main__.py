"""`python -m evaluator`: see `evaluator.cli.main`.

The process, not the library, sets two things here (what each saves: bench/README.md, "__main__.py"):
- the cyclic garbage collector's first threshold at 20,000 allocations, not 700: the study allocates millions of
  objects that live until it ends (records, parsed replies, the registry), and at the default a full collection
  walks all of them again and again. Objects freed by their reference count (nearly all) are not affected;
  cyclic garbage waits at most 20,000 allocations.
- no interpreter teardown after the command: every file is written and closed, every child process stopped and
  every cache transaction committed by then, and freeing each object of the study one by one is time spent for
  nothing. Output and logging are flushed first; the exit code is the command's.
"""

import gc

GC_THRESHOLD = 20_000
gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])  # before the imports: they allocate a lot too

from evaluator.cli.main import end_process, main  # noqa: E402

if __name__ == "__main__":
    end_process(main())
