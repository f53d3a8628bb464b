"""Live progress of the LLM calls, one line per model: done/total, rate, cache hits, retries, 429s, ETA.

A local CPU server may answer one call a minute, so the rate switches units (/s, /min, /h) to stay
readable, and counters and ETA refresh on a timer rather than on each finished call: a slow call
must not freeze the display. Off the terminal (a log file) one plain line per model is printed every
`log_every_s` seconds, whether or not a call finished since.

Rate and ETA count only calls that reached the server: cache hits finish at once, and counting them
would promise a resumed run an ETA it cannot keep.

`Reporter` is the one way progress and warnings leave the stages: the CLI makes one on stderr and hands
it down; every stage defaults to `SILENT`, so a library caller or a test sees nothing it did not ask for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from tqdm import tqdm

from evaluator.core.redact import redact

_TICK_S = 1.0  # terminal refresh of rate and ETA


def format_rate(per_s: float) -> str:
    """A call rate in the unit that keeps two significant figures readable: 12.0/s, 1.8/min, 40/h."""
    if per_s <= 0:
        return "-"
    if per_s >= 1:
        return f"{per_s:.1f}/s"
    if per_s * 60 >= 1:
        return f"{per_s * 60:.1f}/min"
    return f"{per_s * 3600:.2g}/h"


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


class Progress:
    def __init__(
        self,
        totals: dict[str, int],
        enabled: bool = True,
        *,
        log_every_s: float = 30.0,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        stream: TextIO | None = None,
    ) -> None:
        self.totals = totals
        self.done = dict.fromkeys(totals, 0)
        self.finished: dict[str, float] = {}  # model -> when its last call completed
        self.stats: dict[str, Any] = {}
        self.stream = stream  # None: nothing is shown (counters still count)
        self.enabled = enabled and stream is not None
        self.tty = bool(stream is not None and stream.isatty()) if tty is None else tty
        self.log_every_s = log_every_s
        self._clock = clock
        self._t0 = clock()
        self._rich: RichProgress | None = None
        self._tasks: dict[str, Any] = {}
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> Progress:
        self._t0 = self._clock()
        if not self.enabled:
            return self
        if self.tty:
            self._rich = RichProgress(
                TextColumn("[bold]{task.description:>14}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(
                    "{task.fields[rate]:>9}  cache {task.fields[hits]}  retries {task.fields[retries]}  "
                    "429s {task.fields[r429]}"
                ),
                TimeElapsedColumn(),
                TextColumn("ETA {task.fields[eta]}"),
                console=Console(file=self.stream),
                transient=False,
            )
            self._rich.__enter__()
            self._tasks = {
                m: self._rich.add_task(m, total=t, **self.fields(m)) for m, t in self.totals.items()
            }
        # A thread, not an asyncio task: it must tick while the event loop is busy or blocked.
        self._ticker = threading.Thread(target=self._run_ticker, name="progress", daemon=True)
        self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        if self._rich is not None:
            self.tick()
            self._rich.__exit__(None, None, None)
        elif self.enabled:
            self.tick()

    def attach(self, model: str, stats: Any) -> None:
        self.stats[model] = stats

    def advance(self, model: str) -> None:
        self.done[model] += 1
        if self.done[model] >= self.totals[model]:
            self.finished[model] = self._clock()
        if self._rich is not None:
            self._rich.update(self._tasks[model], completed=self.done[model])

    def fields(self, model: str) -> dict[str, Any]:
        """The displayed counters of one model, rate and ETA as text."""
        st = self.stats.get(model)
        hits = int(getattr(st, "cache_hits", 0) or 0)
        done = self.done[model]
        elapsed = max(self.finished.get(model, self._clock()) - self._t0, 1e-9)
        live = max(done - hits, 0)
        rate = live / elapsed
        left = self.totals[model] - done
        eta = 0.0 if left <= 0 else (left / rate if rate > 0 else None)
        return {
            "rate": format_rate(rate),
            "eta": format_eta(eta),
            "hits": hits,
            "retries": getattr(st, "retries", 0),
            "r429": getattr(st, "http_429", 0),
        }

    def tick(self) -> None:
        """Refresh the display now: counters on a terminal, one line per model in a log."""
        if self._rich is not None:
            for m, task in self._tasks.items():
                self._rich.update(task, **self.fields(m))
        elif self.enabled:
            self._log()

    def _run_ticker(self) -> None:
        every = _TICK_S if self._rich is not None else self.log_every_s
        while not self._stop.wait(every):
            try:
                self.tick()
            except Exception:  # a display hiccup must never end a study
                continue

    def _log(self) -> None:
        assert self.stream is not None  # enabled implies a stream
        for m, total in self.totals.items():
            f = self.fields(m)
            self.stream.write(
                f"[{m}] {self.done[m]}/{total} calls, {f['rate']}, ETA {f['eta']}, cache hits {f['hits']}, "
                f"retries {f['retries']}, 429s {f['r429']}\n"
            )
            self.stream.flush()


class Reporter:
    """Where progress and warnings go: `stream` (the CLI hands stderr) or nowhere (`SILENT`).

    `progress` False keeps warnings and notes but shows no bar (`--no-progress`)."""

    def __init__(self, stream: TextIO | None = None, *, progress: bool = True) -> None:
        self.stream = stream
        self.progress = progress and stream is not None

    def info(self, msg: str) -> None:
        if self.stream is not None:
            self.stream.write(redact(msg) + "\n")  # notes may quote a server's words, and servers quote keys
            self.stream.flush()

    def warn(self, msg: str) -> None:
        self.info(f"warning: {msg}")

    def bar(self, total: int, desc: str, *, enabled: bool = True, unit: str = " texts") -> tqdm:
        """A tqdm bar on the stream (disabled, counting nothing visible, when silent or not `enabled`)."""
        return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=self.stream,
                    disable=not (enabled and self.progress))

    def calls(self, totals: dict[str, int], **kw: Any) -> Progress:
        """Live per-model progress of LLM calls (`Progress`), shown on the stream."""
        return Progress(totals, enabled=self.progress, stream=self.stream, **kw)


SILENT = Reporter()
