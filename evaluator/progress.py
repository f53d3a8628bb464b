"""Live progress of the LLM calls, one line per model: done/total, calls/s, cache hits, retries,
429s and ETA. Off the terminal (a log file) it prints one plain line per model every 30 seconds."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

_FIELDS_EVERY_S = 0.2  # refreshing counters on every call would cost more than the call from cache


class Progress:
    def __init__(self, totals: dict[str, int], enabled: bool = True) -> None:
        self.totals = totals
        self.done = dict.fromkeys(totals, 0)
        self.finished: dict[str, float] = {}  # model -> when its last call completed
        self.stats: dict[str, Any] = {}
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self._t0 = time.monotonic()
        self._last = 0.0
        self._last_log = 0.0
        self._rich: RichProgress | None = None
        self._tasks: dict[str, int] = {}

    def __enter__(self) -> Progress:
        self._t0 = time.monotonic()
        if self.enabled and self.tty:
            self._rich = RichProgress(
                TextColumn("[bold]{task.description:>14}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]:>7.1f} calls/s  cache {task.fields[hits]}  retries {task.fields[retries]}  429s {task.fields[r429]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._rich.__enter__()
            self._tasks = {m: self._rich.add_task(m, total=t, rate=0.0, hits=0, retries=0, r429=0) for m, t in self.totals.items()}
        return self

    def __exit__(self, *exc: object) -> None:
        self._refresh(force=True)
        if self._rich is not None:
            self._rich.__exit__(None, None, None)
        elif self.enabled:
            self._log()

    def attach(self, model: str, stats: Any) -> None:
        self.stats[model] = stats

    def advance(self, model: str) -> None:
        self.done[model] += 1
        if self.done[model] >= self.totals[model]:
            self.finished[model] = time.monotonic()
            self._last = 0.0  # show the final rate now
        if self._rich is not None:
            self._rich.advance(self._tasks[model])
        self._refresh()

    def _fields(self, model: str) -> dict[str, Any]:
        st = self.stats.get(model)
        elapsed = max(self.finished.get(model, time.monotonic()) - self._t0, 1e-9)
        return {
            "rate": self.done[model] / elapsed,
            "hits": getattr(st, "cache_hits", 0),
            "retries": getattr(st, "retries", 0),
            "r429": getattr(st, "http_429", 0),
        }

    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < _FIELDS_EVERY_S:
            return
        self._last = now
        if self._rich is not None:
            for m, task in self._tasks.items():
                self._rich.update(task, **self._fields(m))
        elif self.enabled and now - self._last_log >= 30:
            self._log()

    def _log(self) -> None:
        self._last_log = time.monotonic()
        for m, total in self.totals.items():
            f = self._fields(m)
            print(
                f"[{m}] {self.done[m]}/{total} calls, {f['rate']:.1f}/s, cache hits {f['hits']}, "
                f"retries {f['retries']}, 429s {f['r429']}",
                file=sys.stderr,
                flush=True,
            )
