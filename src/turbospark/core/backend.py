"""The ONE interface behind which every generation runs (CONTRACT §3).

A :class:`Backend` is what the registry holds and the generation core
drives: the local llama.cpp model (``local.LocalBackend`` over an engine
``ChatModel``) and a remote engine (``upstream.model.RemoteModel``) alike.
The core asks it to ``prepare`` a :class:`~turbospark.core.request.ChatRequest`
(template and tokenise, or build the upstream body; grammar; admission: every
refusal here is a clean 4xx before any byte) and to ``start`` runs of what it
prepared; what a backend can do is its :class:`Capabilities`, never probed
member by member. A local backend's tokens are known here (``vocabulary``);
a remote one has none (None), and what needs them is refused by the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..engine.channel import Run
from ..engine.slotcontrol import SlotControl
from ..engine.types import AdmissionError, CancelFlag, Embeddings, GenerationConfig, Ranking
from .request import ChatRequest, Prepared


@dataclass(frozen=True)
class Capabilities:
    """What a backend can serve (``/v1/models``, ``/api/show``, ``/props``
    and routing read it)."""

    #: chat, completions and the other generating routes
    chat: bool = True
    #: ``/v1/embeddings``, ``/api/embed``
    embeddings: bool = False
    #: ``/v1/rerank`` and the other rerank routes (a reranker: a GGUF whose
    #: pooling is rank; it serves nothing else)
    rerank: bool = False
    #: images in a prompt
    vision: bool = False
    #: sound in a prompt
    audio: bool = False
    #: its chat template handles thinking apart from the answer; None: not
    #: known here (a remote engine knows its own model)
    thinking: bool | None = False
    #: it holds this machine's memory (counts toward ``--max-resident``);
    #: a remote engine's connections do not
    resident: bool = True


@dataclass(frozen=True)
class Health:
    """What the registry's watchdog reads: why the engine died (None: it
    did not), seconds without an engine step while work waits, and why a
    remote engine's last request got no answer (None once one was)."""

    failure: str | None = None
    stalled_seconds: float = 0.0
    unreachable: str | None = None


@dataclass(frozen=True)
class Upstream:
    """Where a remote backend sends requests, and the environment variable
    its key is read from (the admin routes bind the two)."""

    base_url: str
    api_key_env: str | None


def needs_local(model_id: str, upstream: Upstream | None, what: str) -> AdmissionError:
    """The 400 for what only a model running here can do (its tokens, its
    template), asked of one that runs elsewhere."""
    where = f" ({upstream.base_url})" if upstream is not None else ""
    return AdmissionError(f"model {model_id!r} runs on a remote engine{where}; {what} needs a local model", "model")


class Vocabulary(Protocol):
    """A local model's tokens and template (llama.cpp's ``/tokenize``,
    ``/detokenize``, ``/apply-template``)."""

    @property
    def vocab_size(self) -> int: ...
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]: ...
    def detokenize(self, tokens: list[int]) -> str: ...
    def chat_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str: ...


class Backend(Protocol):
    """What serves a generation (see the module docstring). Blocking
    methods (``prepare``, ``count_prompt``, ``encode``, ``rerank``, ``close``) are
    called off the event loop; ``start`` on it."""

    model_id: str
    aliases: tuple[str, ...]

    @property
    def capabilities(self) -> Capabilities: ...
    @property
    def max_context(self) -> int: ...
    @property
    def vocabulary(self) -> Vocabulary | None: ...
    @property
    def upstream(self) -> Upstream | None: ...

    def info(self) -> dict[str, Any]: ...
    def load(self) -> dict[str, Any]: ...
    def slot_control(self) -> SlotControl | None:
        """Its session slots for llama-server's ``/slots`` routes (view,
        save, restore, erase); None where there are none here (a remote
        engine's are its own)."""
        ...

    def health(self) -> Health: ...
    async def probe(self) -> str | None:
        """A health check (replica groups): why it cannot serve now, or None."""
        ...

    def prepare(self, req: ChatRequest) -> Prepared: ...
    def count_prompt(self, req: ChatRequest) -> int: ...
    def count_text(self, text: str) -> int:
        """Tokens in ``text`` (reasoning split off an answer); 0 where the
        tokens are not known here."""
        ...

    def reserve(self, config: GenerationConfig) -> Callable[[], None]: ...
    def start(self, prepared: Prepared, config: GenerationConfig, cancel: CancelFlag) -> Run: ...
    def start_many(self, prepared: Prepared, configs: list[GenerationConfig], cancel: CancelFlag) -> list[Run]: ...
    def encode(self, texts: list[str], truncate: bool = False) -> Embeddings: ...
    def rerank(
        self,
        query: str,
        documents: list[str],
        cancel: CancelFlag,
        truncate: bool = False,
        max_doc_tokens: int | None = None,
    ) -> Ranking:
        """Each document's score against ``query``, in order (blocking: a
        worker thread); only where ``capabilities.rerank``."""
        ...

    def close(self) -> None: ...
    async def aclose(self) -> None: ...
