"""A batch output answering one custom_id twice, against the simulator's batch API (issue 18): the conflicting
copies are neither used, the request is submitted again, and the cache ends with a clean batch's replies."""

from __future__ import annotations

import asyncio
import copy

from helpers.procs import simulator

from evaluator.batch.batch_submit import BatchRunner
from evaluator.batch.providers import batch_api
from evaluator.batch.request_format import Request
from evaluator.batch.store import JobStore
from evaluator.llm import LLMEngine, load_profile, revised
from evaluator.llm.cache import ResponseCache
from evaluator.study.prompts import PLANNER_MARKER
from simulator.harness import configure_batch


# -- a batch output answering one custom_id twice ------------------------------------------------------------
class _DoctoredOutput:
    """A provider's batch API whose first output file holds a conflicting copy of one line (placed before the
    original) and an identical copy of another."""

    def __init__(self, api):
        self.api, self.doctored = api, False

    def __getattr__(self, name):
        return getattr(self.api, name)

    async def results(self, batch_id):
        out = await self.api.results(batch_id)
        if self.doctored:
            return out
        self.doctored = True
        forged = copy.deepcopy(out[0])
        forged.body["choices"][0]["message"]["content"] = '{"steps": [], "selected_apis": ["Evil/forged"]}'
        return [forged, *out, copy.deepcopy(out[1])]


def _batch_messages(i):
    return [{"role": "system", "content": PLANNER_MARKER},
            {"role": "user", "content": f"User request:\nfind the weather in city #{i}"}]


async def _through_batch(p, root, n, doctor):
    async with LLMEngine(p, cache_root=root) as engine:
        reqs = [Request((pr := engine.prepare(_batch_messages(i), run=0, prompt_version="v1")).key, pr.body) for i in range(n)]
        store, cache = JobStore(root), ResponseCache(root)
        api = batch_api(p, None)
        try:
            stats = await BatchRunner(p, engine, _DoctoredOutput(api) if doctor else api, store, cache).run(reqs)
        finally:
            await api.close()
            store.close()
            cache.close()
        return stats, [engine.lookup(r.custom_id).content for r in reqs]


def test_conflicting_duplicate_custom_id_is_requested_again(tmp_path):
    with simulator() as sim:
        configure_batch(sim.base_url, reset=True, turnaround_s=0.05)
        p = revised(load_profile("sim", base_url=sim.base_url), batch="openai")
        want_stats, want = asyncio.run(_through_batch(p, tmp_path / "clean", 4, doctor=False))
        stats, got = asyncio.run(_through_batch(p, tmp_path / "doctored", 4, doctor=True))
    # Before: the forged copy, first in the file, was stored silently. Now neither copy is used, the request
    # is submitted again, and the cache ends up with the same replies as a clean batch.
    assert got == want and not any("forged" in c for c in got)
    assert stats.conflicting == 1 and stats.resubmitted == 1 and stats.batches == 2
    assert any("different replies" in e for e in stats.errors)
    assert stats.stored == 4 and stats.unusable == 0  # the identical copy of another line was merged, not an error
    assert want_stats.conflicting == 0 and want_stats.batches == 1
