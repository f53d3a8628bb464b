"""Figures are drawn once per change of their data: a rerun with the same numbers keeps the PNGs
(and skips matplotlib), a changed value, a changed or missing PNG redraws, byte for byte."""

from __future__ import annotations

from pathlib import Path

from evaluator.app import figure_store as F
from evaluator.core.cache_layout import SHARED_FIGURES_ENV, CacheLayout
from evaluator.render.charts import png, pyplot


def _draw(calls: list[int], value: float):
    def draw(fig_dir: Path) -> dict[str, bytes]:
        calls.append(1)
        fig, ax = pyplot().subplots(figsize=(3, 2))
        ax.plot([0, 1, 2], [0, value, 1])
        return {"line.png": png(fig, dpi=50)}
    return draw


def test_drawn_only_when_the_data_changes(tmp_path: Path) -> None:
    d = tmp_path / "figures"
    d.mkdir()
    calls: list[int] = []
    first = F.drawn(d, "g", {"v": 0.5}, lambda: _draw(calls, 0.5)(d))
    png = first[0].read_bytes()
    assert len(calls) == 1

    assert F.drawn(d, "g", {"v": 0.5}, lambda: _draw(calls, 0.5)(d)) == first
    assert len(calls) == 1 and first[0].read_bytes() == png  # same data: nothing drawn

    F.drawn(d, "g", {"v": 0.7}, lambda: _draw(calls, 0.7)(d))
    assert len(calls) == 2 and first[0].read_bytes() != png  # new data: drawn again

    first[0].write_bytes(b"not a figure")  # an altered PNG is redrawn, as is a missing one
    F.drawn(d, "g", {"v": 0.7}, lambda: _draw(calls, 0.7)(d))
    assert len(calls) == 3 and first[0].read_bytes().startswith(b"\x89PNG")
    first[0].unlink()
    F.drawn(d, "g", {"v": 0.5}, lambda: _draw(calls, 0.5)(d))
    assert len(calls) == 4 and first[0].read_bytes() == png  # drawing again gives the same bytes

    # Another group's stamp does not hide this one's.
    F.drawn(d, "other", {"v": 0.5}, lambda: _draw(calls, 0.5)(d))
    assert len(calls) == 5


def test_rerun_figures_ignore_timings() -> None:
    a = {"meta": {"k": 5, "timing_s": 1.2, "embed": {"cache_hits": 3}}, "rows": [1]}
    b = {"meta": {"k": 5, "timing_s": 9.9, "embed": {"cache_hits": 7}}, "rows": [1]}
    assert F.figure_inputs(a) == F.figure_inputs(b)
    assert F.figure_inputs(a) != F.figure_inputs({**a, "rows": [2]})


def test_cache_folders_share_one_store_when_told(tmp_path: Path, monkeypatch) -> None:
    # EVALUATOR_SHARED_FIGURES: two cache folders, one store; the second study's figures are copies, not drawings
    monkeypatch.setenv(SHARED_FIGURES_ENV, str(tmp_path / "shared"))
    stores = [CacheLayout(tmp_path / c).figures for c in ("cache-a", "cache-b")]
    assert stores == [tmp_path / "shared"] * 2
    calls: list[int] = []
    a, b = tmp_path / "out-a" / "figures", tmp_path / "out-b" / "figures"
    first = F.drawn(a, "g", {"v": 0.5}, lambda: _draw(calls, 0.5)(a), store=stores[0])
    second = F.drawn(b, "g", {"v": 0.5}, lambda: _draw(calls, 0.5)(b), store=stores[1])
    assert len(calls) == 1 and second[0].read_bytes() == first[0].read_bytes()
    monkeypatch.delenv(SHARED_FIGURES_ENV)
    assert CacheLayout(tmp_path / "cache-a").figures == tmp_path / "cache-a" / "figures"  # each its own by default
