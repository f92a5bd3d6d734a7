"""turbospark: a local LLM inference server on llama.cpp that speaks OpenAI,
Anthropic and Ollama, and reports everything it does as typed events."""

__version__ = "0.1.0"

from typing import Any

from .observe import FanOut, ListObserver, Observer, RingObserver, ServerEvent  # noqa: E402


def __getattr__(name: str) -> Any:
    # The server pulls in uvicorn and llama.cpp; import it only when asked.
    if name == "Server":
        from .server import Server

        return Server
    raise AttributeError(name)


__all__ = ["FanOut", "ListObserver", "Observer", "RingObserver", "Server", "ServerEvent", "__version__"]
