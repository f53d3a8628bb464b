"""What the tests share: builders of data and records, the simulators as fixtures, the CLI and every other child
process (started in its own process group, stopped by it), a virtual clock, the browser.

`tests/conftest.py` loads the modules that define fixtures as plugins (`pytest_plugins`); the others are imported
(`from helpers.cli import run_cli`): `pyproject.toml`'s `pythonpath` puts `tests/` (and the repository root) on
`sys.path`.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository root (this worktree's)
EXAMPLE = REPO / "examples" / "mcp"  # the bundled example registry and queries
FIXTURES = REPO / "tests" / "fixtures"  # recorded provider bodies and old output folders
