"""`python -m evaluator`: see `evaluator.cli.main`."""

import sys

from evaluator.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
