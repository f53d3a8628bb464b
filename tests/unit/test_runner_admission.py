"""Admission of the runner's queries (issue 42): each model keeps its own share of the window busy, so two models'
rate limits are spent side by side, not one after the other. Driven through the real engine and the simulator's own
handlers in this process (`MockTransport`, `simulator/inprocess.py`): no socket, no clock, nothing timed; what is
asserted is the order in which requests reach the two servers."""

from __future__ import annotations

import asyncio
import contextlib

from helpers import llm as F
from helpers.fakes import FixedSearch, scripted_study

from evaluator.llm import revised
from evaluator.llm.transport import Request, Response
from evaluator.study.runner import WINDOW, Admission, StudyRunner, Unit

LIMITS = {"a": 2, "b": 8}  # two models of different limits (requests in flight at once)
RUNS = 40  # x the fixture's 3 queries: 120 queries a model, each sending 2 requests, then its PtR planner


class _Server(F.LocalSim):
    """One model's simulator, writing down each request it is sent in one order shared by both servers;
    `hold` (when set) keeps every reply until it returns True, spinning the event loop meanwhile."""

    def __init__(self, name: str, order: list[str]) -> None:
        super().__init__()
        self.name, self.order = name, order
        self.hold = None

    async def answer(self, request: Request) -> Response:
        self.order.append(self.name)
        if self.hold is not None:
            # Loop turns, not seconds: the other model's whole study takes a few thousand of them here. Waiting
            # on an event instead would hang for good when the other model cannot start (the bug this finds).
            for _ in range(200_000):
                if self.hold():
                    break
                await asyncio.sleep(0)
            else:
                raise AssertionError(f"model {self.name}'s replies were held until the other model finished, "
                                     "and it never did: it waits on this model's window")
        return await super().answer(request)


async def _study_of_two(tmp_path, window: int, setup=None) -> tuple[list[str], list]:
    study = scripted_study(tmp_path)
    order: list[str] = []
    servers = {m: _Server(m, order) for m in LIMITS}
    if setup is not None:
        setup(servers)
    async with contextlib.AsyncExitStack() as stack:
        engines = {m: await stack.enter_async_context(s.engine(revised(
            F.sim_profile(s, concurrency=LIMITS[m], adaptive_concurrency=False), name=m))) for m, s in servers.items()}
        runner = StudyRunner(study, engines, batcher=FixedSearch())
        # model by model, as app.run_study builds them
        units = [Unit(m, r) for m in LIMITS for r in range(RUNS)]
        records = list(await runner.run(units, window=window))
    assert len(records) == 2 * RUNS * len(study.queries)
    return order, records


def _nth(order: list[str], model: str, n: int) -> int:
    """Where the model's n-th request (1-based) stands in the order both servers saw."""
    return [i for i, m in enumerate(order) if m == model][n - 1]


async def test_both_models_first_requests_go_before_either_models_hundredth(tmp_path):
    for window in (16, WINDOW):
        order, _ = await _study_of_two(tmp_path / str(window), window)
        firsts = max(_nth(order, "a", 1), _nth(order, "b", 1))
        assert firsts < min(_nth(order, "a", 100), _nth(order, "b", 100)), (window, order[:120])


async def test_a_model_stalled_by_its_server_never_holds_the_other_back(tmp_path):
    # Model a's server answers nothing until model b has finished its whole study: b must get through on its own
    # share of the window while a's share is full of queries that wait. (Before the shares, a's queries filled the
    # whole window and b's never started: a deadlock.)
    b_requests = 3 * RUNS * 3  # RtP planner, PtR discovery and PtR planner of each of b's queries

    def setup(servers):
        servers["a"].hold = lambda: servers["b"].order.count("b") >= b_requests

    order, records = await _study_of_two(tmp_path, 16, setup)
    assert order.count("b") == b_requests and not any(r.failed_calls for r in records)
    assert order.index("a") < 16 and order.index("b") < 16  # both started at once
    # b did all its work while a's first requests waited: a sent nothing else before b's last request
    assert order[: _nth(order, "b", b_requests)].count("a") == LIMITS["a"]


def test_each_model_keeps_its_share_and_the_window_holds():
    units = [Unit(m, r) for m in ("a", "b", "c") for r in range(2)]
    adm = Admission(units, n_queries=10, window=9)  # 20 queries a model, a share of 3 each
    started = list(adm.admit())
    assert [u.model for u, _ in started] == ["a", "b", "c"] * 3  # one each in turn, up to the shares
    assert adm.total == 9 and list(adm.admit()) == []  # the window is full
    adm.finished("b")
    assert [u.model for u, _ in adm.admit()] == ["b"]  # b's own slot back, to b only
    # c's three slots are owed to c while it has queries to start: a and b, at their shares, never take them
    for _ in range(3):
        adm.finished("c")
    more = list(adm.admit())
    assert [u.model for u, _ in more] == ["c"] * 3
    # within a model, run by run and query by query
    a_starts = [(u.run, q) for u, q in started if u.model == "a"]
    assert a_starts == [(0, 0), (0, 1), (0, 2)]


def test_a_drained_model_hands_its_share_to_the_others():
    units = [Unit("a", 0), Unit("b", 0)]
    adm = Admission(units, n_queries=3, window=8)  # a has 3 queries, b 3: a share of 4 each
    assert [u.model for u, _ in adm.admit()] == ["a", "b", "a", "b", "a", "b"]
    units = [Unit("a", 0), *(Unit("b", r) for r in range(4))]
    adm = Admission(units, n_queries=3, window=8)  # a: 3 queries, b: 12
    first = [u.model for u, _ in adm.admit()]
    assert first.count("a") == 3 and first.count("b") == 5 and adm.total == 8  # b takes what a does not need
    for _ in range(3):
        adm.finished("a")
    assert [u.model for u, _ in adm.admit()] == ["b"] * 3 and adm.total == 8


def test_more_models_than_the_window_still_starts_each_model():
    adm = Admission([Unit(m, 0) for m in "abcde"], n_queries=4, window=2)
    assert [u.model for u, _ in adm.admit()] == list("abcde")  # one each: the bound is max(window, models)
    assert adm.total == 5
