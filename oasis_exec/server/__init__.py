"""OpenAI-compatible HTTP server over the executor engine (`python -m oasis_exec serve`)."""
