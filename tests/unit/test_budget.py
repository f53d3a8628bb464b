"""`--budget USD` given wrong, before any work, in one line (exit 2): a bad value, a bad value in the config, a
profile without prices; and the one price rule (an unknown price is never zero, the batch discount applies once)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO
from helpers.data import make_data_dir

from evaluator.cli import main as cli
from evaluator.core.money import capped_usd, cost_usd

SIM_TOML = REPO / "configs" / "models" / "sim.toml"


@pytest.fixture
def study(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """The CLI in this process on the tiny data folder, the model at an endpoint nobody listens on (nothing is
    started or sent: tests/unit): (exit code, stderr) of `study(*extra, model=...)`."""
    data = make_data_dir(tmp_path / "data")

    def run(*extra: str, model: str = "sim") -> tuple[int, str]:
        rc = cli.main(["--data", str(data), "--cache-dir", str(tmp_path / "cb"), "--out", str(tmp_path / "ob"),
                       "--model", model, "--base-url", "http://127.0.0.1:9/v1", "--runs", "4", "--no-progress",
                       "--no-extras", *extra])
        return rc, capsys.readouterr().err

    return run


@pytest.mark.parametrize("value", ["-1", "abc", "nan"])
def test_a_bad_budget_is_one_line(study, value):
    rc, err = study("--budget", value)
    assert rc == 2
    assert err.count("\n") == 1 and "--budget" in err and "Traceback" not in err


def test_a_budget_in_the_config_is_checked(study, tmp_path):
    cfg = tmp_path / "neg.toml"
    cfg.write_text((REPO / "configs" / "default.toml").read_text().replace('out = ""', 'out = ""\nbudget_usd = -3'))
    rc, err = study("--config", str(cfg))
    assert rc == 2 and err.count("\n") == 1 and "budget_usd" in err


def test_a_budget_on_a_profile_without_prices_is_one_line(study, tmp_path):
    toml = tmp_path / "noprice.toml"
    toml.write_text("".join(ln + "\n" for ln in SIM_TOML.read_text().splitlines() if not ln.startswith(("input_per_mtok", "output_per_mtok"))))
    rc, err = study("--budget", "5", model=str(toml))  # nothing sent: a unit test opens no socket
    assert rc == 2 and err.count("\n") == 1, err
    assert "price" in err and "noprice" in err


def test_one_price_rule_unknown_is_never_zero_and_the_batch_discount_applies_once():
    @dataclass
    class P:
        input_per_mtok: float | None = 1.0
        output_per_mtok: float | None = 2.0
        batch_discount: float | None = 0.5
        cached_input_per_mtok: float | None = None
        cache_write_per_mtok: float | None = None

    assert cost_usd(P(), 1_000_000, 1_000_000) == 3.0
    assert cost_usd(P(), 1_000_000, 1_000_000, batch=True) == capped_usd(P(), 1_000_000, 1_000_000, batch=True) == 1.5
    assert cost_usd(P(batch_discount=None), 1, 1, batch=True) is None  # the report says "unknown"
    assert capped_usd(P(batch_discount=None), 1_000_000, 0, batch=True) == 1.0  # a cap assumes no saving it can't see
    assert cost_usd(P(output_per_mtok=None), 1, 1) is None
    with pytest.raises(ValueError):  # a capped run checks prices first (check_priced): unpriced here is a bug
        capped_usd(P(input_per_mtok=None), 1, 1)
