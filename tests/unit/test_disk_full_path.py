"""A full disk whose error names no file (a write through an open handle, a database on a full disk) still ends
in one line naming where to free space: the folders the command writes (issue 31, item 10)."""

from __future__ import annotations

import errno
import sqlite3

import pytest
from helpers import records as F

from evaluator.app import outputs as app
from evaluator.cli.main import main


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   sqlite3.OperationalError("database or disk is full")])
def test_a_full_disk_without_a_file_name_names_the_folder(tmp_path, monkeypatch, capsys, error):
    out = F.write_out(tmp_path / "run", F.study(("sim",), runs=1), F.meta(("sim",), runs=1))

    def full(*_a, **_k):
        raise error

    monkeypatch.setattr(app.figure_store, "drawn", full)  # the figures written (app.figure_store)
    assert main(["report", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert f"cannot read or write {out}:" in err and "Free space on that disk" in err


def test_other_database_errors_are_not_called_a_full_disk(tmp_path, monkeypatch):
    out = F.write_out(tmp_path / "run", F.study(("sim",), runs=1), F.meta(("sim",), runs=1))

    def locked(*_a, **_k):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(app.figure_store, "drawn", locked)
    with pytest.raises(sqlite3.OperationalError):
        main(["report", str(out)])
