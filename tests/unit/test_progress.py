"""Progress display: readable rates for slow servers, an ETA, and lines that keep coming while calls are slow."""

from __future__ import annotations

import io
import threading
from types import SimpleNamespace

from evaluator.core.progress import SILENT, Progress, Reporter, format_eta, format_rate


def test_rates_stay_readable_for_slow_servers() -> None:
    assert format_rate(12.0) == "12.0/s"
    assert format_rate(0.03) == "1.8/min"  # one call every ~33 s: not "0.0/s"
    assert format_rate(1 / 600) == "6/h"
    assert format_rate(0.0) == "-"


def test_eta_from_the_live_call_rate() -> None:
    now = [100.0]
    p = Progress({"m": 40}, enabled=False, clock=lambda: now[0])
    p.attach("m", SimpleNamespace(cache_hits=10, retries=1, http_429=0))
    for _ in range(20):  # 10 cache hits (instant) + 10 calls that reached the server
        p.advance("m")
    now[0] += 300.0  # 10 live calls in 5 minutes
    f = p.fields("m")
    assert f["rate"] == "2.0/min"
    assert f["eta"] == format_eta(20 / (10 / 300)) == "0:10:00"
    assert (f["hits"], f["retries"]) == (10, 1)


def test_eta_is_unknown_before_any_live_call_and_zero_when_done() -> None:
    now = [0.0]
    p = Progress({"m": 2}, enabled=False, clock=lambda: now[0])
    now[0] = 50.0
    assert p.fields("m")["eta"] == "?"
    p.advance("m")
    p.advance("m")
    assert p.fields("m")["eta"] == "0:00:00"


class Lines(io.StringIO):
    """A log stream (not a terminal: plain lines) that counts the lines written to it, for a test to wait on."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Semaphore(0)

    def write(self, s: str) -> int:
        n = super().write(s)
        for _ in range(s.count("\n")):
            self.written.release()
        return n


def test_plain_log_prints_on_a_timer_while_no_call_finishes() -> None:
    out = Lines()
    with Reporter(out).calls({"slow": 5}, log_every_s=0.01):
        # not one call finished, and lines keep coming: the timer thread's, waited for, never slept on
        assert all(out.written.acquire(timeout=60) for _ in range(3)), out.getvalue()
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and all(x.startswith("[slow] 0/5 calls") and "ETA ?" in x for x in lines)


def test_reporter_writes_only_to_the_stream_it_was_handed(capsys) -> None:
    out = io.StringIO()
    r = Reporter(out, progress=False)
    r.warn("damaged shard")
    r.info("note: k=20 left out")
    with r.bar(3, "embedding") as bar, r.calls({"m": 1}) as calls:
        bar.update(3)
        calls.advance("m")
    assert out.getvalue() == "warning: damaged shard\nnote: k=20 left out\n"  # --no-progress: no bar
    SILENT.warn("x")
    SILENT.info("y")
    with SILENT.bar(2, "embedding") as bar, SILENT.calls({"m": 1}, tty=False, log_every_s=0.01) as calls:
        bar.update(2)
        calls.advance("m")
        calls.tick()  # what its timer would do
    assert capsys.readouterr() == ("", "")  # the default says nothing, on any stream


def test_terminal_counters_refresh_without_a_finished_call() -> None:
    now = [0.0]
    p = Progress({"m": 3}, tty=True, clock=lambda: now[0], stream=io.StringIO())
    with p:
        p.advance("m")
        now[0] = 60.0
        p.tick()  # what the timer thread does every second
        task = p._rich.tasks[0]  # type: ignore[union-attr]
        assert task.fields["rate"] == "1.0/min" and task.fields["eta"] == "0:02:00"
        now[0] = 120.0
        p.tick()
        assert p._rich.tasks[0].fields["rate"] == "30/h"  # type: ignore[union-attr]
