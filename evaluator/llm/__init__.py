"""Async LLM engine: model profiles, rate limits, retries, durable response cache, accounting."""

from .accounting import ModelStats
from .cache import ResponseCache, cache_clear, cache_stats
from .engine import ChatResult, LLMEngine, Prepared
from .errors import ConfigError, FatalLLMError
from .profiles import ModelProfile, available_profiles, load_profile, resolve_api_key

__all__ = [
    "ChatResult",
    "ConfigError",
    "FatalLLMError",
    "LLMEngine",
    "ModelProfile",
    "ModelStats",
    "Prepared",
    "ResponseCache",
    "available_profiles",
    "cache_clear",
    "cache_stats",
    "load_profile",
    "resolve_api_key",
]
