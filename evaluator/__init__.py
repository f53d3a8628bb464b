"""evaluator: batch evaluation of tool-discovery architectures (RtP vs PtR) for LLM agents."""

__version__ = "0.1.0"
