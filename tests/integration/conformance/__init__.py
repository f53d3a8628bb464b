"""The official SDKs (openai, google-genai, anthropic) as clients of the simulator: a third party checking the
protocol that the simulator and the project's own clients share."""
