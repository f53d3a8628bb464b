"""An output folder's lock in one process (issue 38): re-entrant, and a folder made for nothing written is
removed again."""

from __future__ import annotations

from evaluator.results.outlock import LOCK_FILE, writing  # noqa: E402


def test_the_lock_is_reentrant_in_one_process_and_leaves_no_folder_behind(tmp_path):
    folder = tmp_path / "new" / "out"
    notes: list[str] = []
    with writing(folder, "outer", notes.append):
        with writing(folder, "inner"):
            assert (folder / LOCK_FILE).is_file()
        assert (folder / LOCK_FILE).is_file()
    assert not folder.exists() and notes == []  # created for nothing written: removed again
