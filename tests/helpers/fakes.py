"""In-process stand-ins for a study's chat clients and stub search, and the small studies they drive: the runner
is run in this process, every list is real and every call is counted by the test, not by the code under test.

`SimClient` answers every prompt as the simulator does (`simulator.behaviour.reply`); `WordSearch` ranks the
registry by shared words; `make_study` is the tiny registry's study for given architectures. `ScriptedClient` and
`FixedSearch` answer fixed replies and rows; `scripted_study` is their study (G1 only, one run).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from evaluator.data import Warnings, find_query_files, load_query_files, load_registry
from evaluator.llm import ChatResult
from evaluator.retrieval import ranking
from evaluator.retrieval.ranking import Retrieved
from evaluator.settings.sections import RetrievalSettings, RunSettings
from evaluator.study import prompts
from evaluator.study.prepare import PreparedStudy
from helpers.data import make_data_dir
from simulator.behaviour import reply

_WORD = re.compile(r"[a-z0-9]+")


class SimClient:
    """Every prompt answered as the simulator answers it; each call recorded with its prompt version."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []  # (prompt version, first user line)

    async def chat(self, messages: list[dict], *, run: int, prompt_version: str, **_kw: object) -> ChatResult:
        self.calls.append((prompt_version, messages[-1]["content"].splitlines()[1]))
        text, finish = reply(messages, seed=run, temperature=0.0)
        return ChatResult(text, finish, len(json.dumps(messages)) // 4, len(text) // 4)


class WordSearch:
    """Each text's registry rows ranked by shared words (ties to the lower row), merged as PtR merges stubs."""

    def __init__(self, texts: list[str], k_max: int, ks: list[int]) -> None:
        self.docs = [set(_WORD.findall(t.lower())) for t in texts]
        self.k_max, self.ks = k_max, ks

    def hits(self, text: str) -> tuple[list[int], list[float]]:
        words = set(_WORD.findall(text.lower()))
        scored = sorted(range(len(self.docs)), key=lambda i: (-len(words & self.docs[i]), i))[: self.k_max]
        return scored, [len(words & self.docs[i]) / (1 + len(words)) for i in scored]

    async def retrieve(self, texts: list[str]) -> Retrieved:
        import numpy as np
        got = [self.hits(t) for t in texts]
        rows = np.array([r for r, _ in got]), np.array([s for _, s in got])
        return ranking.ptr_from_hits(rows[1], rows[0], [0] * len(texts), 1, self.k_max, self.ks)[0]

    async def serve(self) -> None:
        await asyncio.Event().wait()


def make_study(tmp_path: Path, arch_specs: list[str], route_tau: float | None = None) -> tuple[PreparedStudy, WordSearch]:
    data = make_data_dir(tmp_path / "data")
    w = Warnings()
    reg = load_registry(data / "registry" / "apis.jsonl.gz", "full", w)
    queries = load_query_files(find_query_files(data), reg, w)
    retrieval = RetrievalSettings(ks=(1, 5))
    run_ = RunSettings(models=("sim",), runs=1, archs=tuple(arch_specs), route_tau=route_tau)
    search = WordSearch(reg.texts(), retrieval.k_max, sorted(set(retrieval.ks)))
    rtp = [Retrieved(*search.hits(q.text)) for q in queries]
    return PreparedStudy(retrieval, run_, data, reg, queries, None, None, None, None, rtp, w), search  # type: ignore[arg-type]


class ScriptedClient:
    """Answers discovery with one stub and the planner with the first offered API; query 2's planner
    reply is cut at max_tokens and query 3's planner call fails for good."""

    def __init__(self, study: PreparedStudy) -> None:
        self.study = study
        self.calls: list[str] = []

    async def chat(self, messages: list[dict], *, run: int, prompt_version: str, **_kw: object) -> ChatResult:
        user = messages[-1]["content"]
        if prompt_version == prompts.DISCOVERY_VERSION:
            self.calls.append("discovery")
            return ChatResult('{"stubs": [{"name": "get_weather", "reasoning": "forecast"}]}', "stop", 10, 5)
        self.calls.append("planner")
        if "Convert 100 dollars" in user:
            return ChatResult('{"steps": ["convert"], "apis": ["Currency Exchange/convert"]', "length", 10, 50)
        if "transfer history" in user:
            return ChatResult(None, None, error="HTTP 500 after 0 retries", error_kind="http_500")
        return ChatResult('{"steps": ["look it up"], "apis": ["Weather API/get forecast"]}', "stop", 10, 7)


class FixedSearch:
    """A stub search that returns the first registry rows, whatever the stubs say."""

    def __init__(self) -> None:
        self.served = False
        self.asked: list[list[str]] = []

    async def retrieve(self, texts: list[str]) -> Retrieved:
        self.asked.append(texts)
        return Retrieved([0, 1, 2, 3, 4], [0.9, 0.8, 0.7, 0.6, 0.5], [[0, 1, 2, 3, 4]], [[0.9, 0.8, 0.7, 0.6, 0.5]],
                         width={5: 5})

    async def serve(self) -> None:
        self.served = True
        await asyncio.Event().wait()  # runs until the pipeline cancels it


def scripted_study(tmp_path: Path) -> PreparedStudy:
    data = make_data_dir(tmp_path / "data")
    w = Warnings()
    reg = load_registry(data / "registry" / "apis.jsonl.gz", "full", w)
    queries = load_query_files(find_query_files(data), reg, w, subsets=["G1_instruction"])
    rtp = [Retrieved([5, 6, 7, 8, 9], [0.5, 0.4, 0.3, 0.2, 0.1]) for _ in queries]
    return PreparedStudy(RetrievalSettings(ks=(1, 5)), RunSettings(models=("scripted",), runs=1), data, reg, queries, None, None, None, None, rtp, w)  # type: ignore[arg-type]


