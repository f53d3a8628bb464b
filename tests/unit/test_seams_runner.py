"""The runner's seam, in process on a virtual clock (helpers/fakes.py's small study: the simulator's replies, a word-overlap
search): an architecture's own time excludes the model calls, searches and outcomes it waits on; a plugin may catch
another's failure and go on; a router's side that closes a cycle is refused; bad arguments to `ctx.search` and
`ctx.chat` are contract failures; `ctx.search` takes any retriever by name and `ctx.registry` is the study's."""

from __future__ import annotations

import asyncio
from pathlib import Path

from helpers.clock import run_virtual
from helpers.fakes import SimClient, WordSearch, make_study

from evaluator.llm import ChatResult
from evaluator.results.schema import Record
from evaluator.retrieval.ranking import Retrieved
from evaluator.study.runner import StudyRunner, Unit

PLUGINS = '''
import asyncio
from evaluator.study.archs import ArchFailure, Discovery

class Slow:
    """Its model call takes longer than its time limit: that time is the model's, not its own."""
    name = "slow"
    async def retrieve(self, ctx):
        await ctx.chat([{"role": "user", "content": "x\\nUser request: " + ctx.text}], prompt_version="slow-v1")
        found = await ctx.search([ctx.text])
        return Discovery(found.merged.ids, found.merged.scores)

class Busy:
    """Sleeps on its own (not a seam): that is its own time."""
    name = "busy"
    async def retrieve(self, ctx):
        await asyncio.sleep(30)
        return Discovery(list(ctx.query_hits.ids), list(ctx.query_hits.scores))

class Broken:
    name = "broken"
    async def retrieve(self, ctx):
        raise RuntimeError("always")

class Careful:
    """Asks for a failing architecture's outcome, catches its failure and goes on with RtP's list."""
    name = "careful"
    async def retrieve(self, ctx):
        try:
            await ctx.outcome("broken")
        except ArchFailure as e:
            return Discovery(list(ctx.query_hits.ids), trace={"kind": e.kind, "why": str(e)})
        raise AssertionError("the outcome of broken should have failed")

class RouterA:
    name = "routera"
    async def retrieve(self, ctx):
        return Discovery([], side="routerb")

class RouterB:
    name = "routerb"
    async def retrieve(self, ctx):
        return Discovery([], side="routera")

class BadSearch:
    name = "badsearch"
    async def retrieve(self, ctx):
        await ctx.search(ctx.text)  # a string, not a list of strings
        return Discovery([], plan=False)

class BadChat:
    name = "badchat"
    async def retrieve(self, ctx):
        await ctx.chat("hello", prompt_version="v1")
        return Discovery([], plan=False)

class Unknown:
    name = "unknown"
    async def retrieve(self, ctx):
        return await ctx.outcome("nosuch")

class Lexical:
    """Searches with BM25 by name and reads the registry without a file."""
    name = "lexical"
    async def retrieve(self, ctx):
        found = await ctx.search([ctx.text], retriever="bm25")
        first = ctx.registry.api(ctx.registry.ids[0])
        return Discovery(found.merged.ids, None, trace={"n": len(ctx.registry), "first": first.display,
                                                        "id": ctx.registry.id_of(first.tool_name, first.api_name)})
'''


class SlowClient(SimClient):
    """The simulator's replies, the plugin's own calls taking 1.5 s each."""

    async def chat(self, messages: list[dict], *, run: int, prompt_version: str, **kw: object) -> ChatResult:
        if prompt_version == "slow-v1":
            await asyncio.sleep(1.5)
        return await super().chat(messages, run=run, prompt_version=prompt_version, **kw)


class Named(WordSearch):
    """The word search, noting which retriever each search asked for."""

    def __init__(self, *a: object) -> None:
        super().__init__(*a)  # type: ignore[arg-type]
        self.asked: list[str | None] = []

    async def retrieve(self, texts: list[str], retriever: str | None = None) -> Retrieved:
        self.asked.append(retriever)
        return await super().retrieve(texts)


def _run(tmp_path: Path, names: list[str], timeout: float = 300.0, client: SimClient | None = None
         ) -> tuple[dict[tuple[str, object], Record], Named]:
    (tmp_path / "plugins.py").write_text(PLUGINS, encoding="utf-8")
    study, search = make_study(tmp_path, ["rtp", *(f"{tmp_path / 'plugins.py'}:{n}" for n in names)])
    study.run = type(study.run)(models=("sim",), runs=1, archs=study.run.archs, arch_timeout_s=timeout)
    named = Named(study.registry.texts(), study.retrieval.k_max, sorted(set(study.retrieval.ks)))
    runner = StudyRunner(study, {"sim": client or SimClient()}, batcher=named)
    recs = run_virtual(lambda _loop: runner.run([Unit("sim", 0)]))  # 1.5 s calls and 0.5 s limits take no time
    return {(r.subset, r.query_id): r for r in recs}, named


def test_own_time_leaves_out_the_model_calls_and_counts_its_own_waits(tmp_path: Path) -> None:
    recs, _ = _run(tmp_path, ["Slow", "Busy"], timeout=0.5, client=SlowClient())
    for r in recs.values():
        slow, busy = r.arch("slow"), r.arch("busy")
        assert slow is not None and slow.failure is None and slow.retrieved  # 1.5 s in its call: not its own
        assert busy is not None and busy.failure is not None and busy.failure.kind == "timeout"
        assert "arch_timeout_s = 0.5 s" in busy.failure.error


def test_a_plugin_may_catch_anothers_failure_and_go_on(tmp_path: Path) -> None:
    recs, _ = _run(tmp_path, ["Broken", "Careful"])
    for r in recs.values():
        broken, careful = r.arch("broken"), r.arch("careful")
        assert broken is not None and broken.failure is not None and broken.failure.kind == "arch_error"
        assert careful is not None and careful.failure is None and careful.retrieved == r.rtp.retrieved  # type: ignore[union-attr]
        assert careful.trace == {"kind": "arch_error", "why": "its outcome of 'broken' failed (arch_error): retrieve "
                                                              "raised RuntimeError: always"}
        assert careful.scores == [round(1 / (i + 1), 6) for i in range(len(careful.retrieved))]  # omitted: 1/rank


def test_routers_that_send_to_each_other_are_a_cycle_not_a_hang(tmp_path: Path) -> None:
    recs, _ = _run(tmp_path, ["RouterA", "RouterB"])
    for r in recs.values():
        kinds = {n: (b.failure.kind if b.failure else None) for n in ("routera", "routerb") if (b := r.arch(n))}
        assert set(kinds.values()) == {"cycle"}, kinds


def test_bad_arguments_at_the_seam_are_contract_failures(tmp_path: Path) -> None:
    recs, _ = _run(tmp_path, ["BadSearch", "BadChat", "Unknown"])
    for r in recs.values():
        got = {n: r.arch(n).failure for n in ("badsearch", "badchat", "unknown")}  # type: ignore[union-attr]
        assert all(f is not None and f.kind == "contract" for f in got.values()), got
        assert got["badsearch"].error.startswith(f"ctx.search takes a list of strings, not {r.query[:20]!r}"[:-1])  # type: ignore[union-attr]
        assert got["badchat"].error.startswith("ctx.chat takes a non-empty list of messages")  # type: ignore[union-attr]
        assert "outcome of 'nosuch', which is neither built-in" in got["unknown"].error  # type: ignore[union-attr]


def test_search_by_retriever_name_and_the_registry_without_a_file(tmp_path: Path) -> None:
    recs, named = _run(tmp_path, ["Lexical"])
    assert named.asked.count("bm25") == len(recs)  # each of its searches asked for BM25 by name
    for r in recs.values():
        b = r.arch("lexical")
        assert b is not None and b.failure is None and b.trace is not None
        assert b.trace["n"] == 14 and b.trace["id"] == b.trace["first"].replace("/", "::", 1)
