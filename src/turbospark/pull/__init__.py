"""Models a user names: references (``org/repo:Q4_K_M``, ``ollama:qwen2.5:0.5b``,
a packaged name, a URL), the one local store they land in, and the downloads
that fill it, with progress. Imports ``observe/`` and ``models/`` (the
catalog); nothing here knows HTTP routes."""
