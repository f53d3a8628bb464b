"""Async LLM engine: model profiles, rate limits, retries, durable response cache, accounting."""

from evaluator.llm.accounting import ModelStats
from evaluator.llm.cache import ResponseCache, cache_clear, cache_stats, new_invocation
from evaluator.llm.engine import ChatResult, LLMEngine, Prepared
from evaluator.llm.profiles import ModelProfile, available_profiles, load_profile, resolve_api_key, revised

__all__ = [
    "ChatResult",
    "LLMEngine",
    "ModelProfile",
    "ModelStats",
    "Prepared",
    "ResponseCache",
    "available_profiles",
    "cache_clear",
    "cache_stats",
    "load_profile",
    "new_invocation",
    "resolve_api_key",
    "revised",
]
