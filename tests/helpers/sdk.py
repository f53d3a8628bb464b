"""Helpers of the conformance suite (tests/integration/conformance/): the official SDKs (openai, google-genai,
anthropic) as clients of the bundled simulator, a third party checking the protocol that the simulator and the
project's own batch clients share."""

from __future__ import annotations

import asyncio

from evaluator.batch.request_format import Request
from evaluator.llm import load_profile


def chat_body(i: int, model: str = "sim-1") -> dict:
    return {"model": model, "temperature": 0.0, "seed": i % 2,
            "messages": [{"role": "system", "content": "You are the planning step of an LLM agent."},
                         {"role": "user", "content": f"User request:\nfind the weather in city #{i}"}]}


def submit_with_project_client(api_class, sim, n: int, token: str) -> str:
    """Submit n chat requests through the project's own batch client (`OpenAIBatch`, `GeminiBatch`)."""
    async def go() -> str:
        api = api_class(load_profile("sim", base_url=sim.base_url), None)  # its session needs the running loop
        try:
            return await api.submit([Request(f"key-{i}", chat_body(i)) for i in range(n)], token)
        finally:
            await api.close()

    return asyncio.run(go())
