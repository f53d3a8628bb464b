"""An own call of an architecture that failed for good leaves its block unscored and unplanned, built-in or plugin
(the runner in this process; a whole study with misbehaving plugins: tests/integration/test_seams.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from helpers.fakes import SimClient, make_study

from evaluator.analysis import stats as S
from evaluator.analysis.metrics import record_obs
from evaluator.llm import ChatResult
from evaluator.study import prompts
from evaluator.study.runner import StudyRunner, Unit

BAD_QUERY = ("G1_instruction", 3)  # the query that names Messi


class _FailingFor(SimClient):
    """The simulator's answers, but the calls of one prompt version for the Messi query fail for good."""

    def __init__(self, version: str) -> None:
        super().__init__()
        self.version = version

    async def chat(self, messages: list[dict], *, run: int, prompt_version: str, **kw: object) -> ChatResult:
        if prompt_version == self.version and "Messi" in messages[-1]["content"]:
            self.calls.append((prompt_version, "failed"))
            return ChatResult(None, None, error="HTTP 500 after retries", error_kind="http_500")
        return await super().chat(messages, run=run, prompt_version=prompt_version, **kw)


OWN_CALL = '''
from evaluator.study.archs import Discovery
class Asks:
    name = "asks"
    async def retrieve(self, ctx):
        reply = await ctx.chat([{"role": "user", "content": "Name the APIs.\\nUser request: " + ctx.text}],
                               prompt_version="asks-v1")
        found = await ctx.search([ctx.text])  # searched whatever the reply: the list stands on the failed call
        return Discovery(found.merged.ids, found.merged.scores, calls={"asks": reply})
'''


@pytest.mark.parametrize("fallback", [False, True])
def test_an_own_call_that_failed_for_good_leaves_the_block_unscored_and_unplanned(tmp_path: Path,
                                                                                    fallback: bool) -> None:
    (tmp_path / "asks.py").write_text(OWN_CALL, encoding="utf-8")
    study, search = make_study(tmp_path, ["rtp", "rewrite", f"{tmp_path / 'asks.py'}:Asks"])
    study = dataclasses.replace(study, retrieval=dataclasses.replace(study.retrieval, fallback_to_query=fallback))
    for arch, version in (("rewrite", prompts.REWRITE_VERSION), ("asks", "asks-v1")):
        client = _FailingFor(version)
        runner = StudyRunner(study, {"sim": client}, batcher=search)
        recs = {(r.subset, r.query_id): r for r in asyncio.run(runner.run([Unit("sim", 0)]))}
        failed = recs[BAD_QUERY].arch(arch)
        assert failed is not None and failed.errors == {arch: "http_500"} and failed.excluded
        # no planner for it: the Messi query's planners are the other two architectures' only
        planners = [c for c in client.calls if c[0] == prompts.PLANNER_VERSION and "Messi" in c[1]]
        assert len(planners) == 2 and failed.plan is not None and failed.plan.llm_error is None
        obs = record_obs(recs[BAD_QUERY], [1, 5], 5)
        assert not any(k[0] == arch and k[1] in ("recall", "ndcg", "pass") for k in obs)
        assert obs[(arch, "own_call_error", None, None)] == (1.0, 1.0)
        # the summary's mean over G1 is over the two other queries
        summary = S.summarize(list(recs.values()), [1, 5], 5)
        kept = [record_obs(r, [5], 5)[(arch, "recall", 5, "api_list")][0] for key, r in recs.items()
                if key[0] == "G1_instruction" and key != BAD_QUERY]
        row = summary.row("sim", "G1_instruction", arch, "recall", 5, "api_list")
        assert row is not None and row.values == [pytest.approx(sum(kept) / 2)]
        assert summary.row("sim", "G1_instruction", arch, "own_call_error").values == [1.0]  # type: ignore[union-attr]
