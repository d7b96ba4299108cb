"""`caidllm serve`: an OpenAI-compatible HTTP server over the step-level engine."""
