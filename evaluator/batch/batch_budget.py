"""`--budget` with `--batch`: each batch's worst case is reserved before it is submitted.

A provider's batch API takes one call per batch, so the check is per batch: the worst case of every
request in it (prompt tokens by the token rule, plus all of `max_tokens`) at the batch price
(`core.money`: online price x (1 - `batch_discount`); the online price when no discount is given). A batch that could pass the budget is not submitted; the study
stops with `BudgetExhausted` (batches already submitted are recorded and polled by the rerun). When a
batch's results are fetched its reservation is settled with the tokens the provider reports.
"""

from __future__ import annotations

from typing import Any

from evaluator.batch.providers import BatchAPI
from evaluator.batch.request_format import Request, Result
from evaluator.core.errors import BudgetExhausted
from evaluator.core.money import capped_usd
from evaluator.llm.budget import Budget, worst_case_usd
from evaluator.llm.profiles import ModelProfile


class BudgetedBatches:
    """A `BatchAPI` whose `submit` reserves the batch's worst case first; everything else is the wrapped API's."""

    def __init__(self, api: BatchAPI, budget: Budget, profile: ModelProfile) -> None:
        self._api = api
        self._budget = budget
        self._profile = profile
        self._reserved: dict[str, float] = {}  # batch id -> its reservation

    async def submit(self, requests: list[Request], token: str) -> str:
        usd = sum(worst_case_usd(self._profile, r.body, batch=True) for r in requests)
        if not self._budget.reserve(usd):
            raise BudgetExhausted(self._budget.stop_message())
        try:
            batch_id = await self._api.submit(requests, token)
        except BaseException:
            self._budget.settle(usd, 0.0)  # never created: nothing to pay
            raise
        self._reserved[batch_id] = usd
        return batch_id

    async def results(self, batch_id: str) -> list[Result]:
        results = await self._api.results(batch_id)
        if batch_id not in self._reserved:  # submitted by an earlier invocation: its spend was that one's
            return results
        pt = ct = 0
        for r in results:
            usage = ((r.body or {}).get("usage") or {}) if r.ok else {}
            pt += int(usage.get("prompt_tokens") or 0)
            ct += int(usage.get("completion_tokens") or 0)
        self._budget.settle(self._reserved.pop(batch_id), capped_usd(self._profile.prices, pt, ct, batch=True))
        return results

    async def state(self, batch_id: str) -> Any:
        st = await self._api.state(batch_id)
        if st.done and (st.queue_full or st.too_large) and batch_id in self._reserved:
            # Refused, not run: the runner submits its requests again (whole or split), which reserves anew.
            self._budget.settle(self._reserved.pop(batch_id), 0.0)
        return st

    def __getattr__(self, name: str) -> Any:  # line_size, find, cancel, close
        return getattr(self._api, name)
