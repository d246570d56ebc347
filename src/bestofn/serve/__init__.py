"""`bestofn serve`: the OpenAI-style speech endpoint (HTTP, the service behind it)."""
