"""The local backend: a model that runs in this process (an engine
``ChatModel``, the llama.cpp one or the tests' scripted one) behind the
``backend.Backend`` interface. It prepares prompts itself
(``prompt.prepare_local``: template, tokens, grammars, admission) and starts
runs on its engine; its tokens are known here (``vocabulary``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.backend import Capabilities, Health, Upstream, Vocabulary
from ..core.request import ChatRequest, Prepared
from ..engine.channel import Run
from ..engine.interface import ChatModel
from ..engine.slotcontrol import SlotControl
from ..engine.types import CancelFlag, Embeddings, GenerationConfig, Ranking
from ..tools.prompting import template_thinks
from .prompt import prepare_local, render


class LocalBackend:
    """A :class:`~turbospark.core.backend.Backend` over a local engine."""

    def __init__(self, engine: ChatModel) -> None:
        self.engine = engine
        self.model_id = engine.model_id
        self.aliases = tuple(engine.aliases)
        self._capabilities = Capabilities(
            chat=engine.supports_chat,
            embeddings=engine.supports_embeddings,  # (a llama.cpp chat model embeds too)
            rerank=engine.supports_rerank,
            vision=engine.vision,
            audio=engine.audio,
            thinking=template_thinks(engine.template_source),
            resident=True,
        )

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    @property
    def max_context(self) -> int:
        return self.engine.max_context

    @property
    def vocabulary(self) -> Vocabulary:
        return self.engine

    @property
    def upstream(self) -> Upstream | None:
        return None

    def info(self) -> dict[str, Any]:
        return self.engine.info()

    def load(self) -> dict[str, Any]:
        return self.engine.load()

    def slot_control(self) -> SlotControl | None:
        return self.engine.slot_control()

    def health(self) -> Health:
        return Health(self.engine.failure, self.engine.stalled_for())

    async def probe(self) -> str | None:
        """Its engine runs in this process: the registry's watchdog reads its
        health (``health``), there is nothing to ask."""
        return None

    # -- generating ----------------------------------------------------------------
    def prepare(self, req: ChatRequest) -> Prepared:
        return prepare_local(self.engine, req)

    def count_prompt(self, req: ChatRequest) -> int:
        return len(render(self.engine, req))

    def count_text(self, text: str) -> int:
        return len(self.engine.tokenize(text, False, False)) if text else 0

    def reserve(self, config: GenerationConfig) -> Callable[[], None]:
        return self.engine.reserve(config)

    def start(self, prepared: Prepared, config: GenerationConfig, cancel: CancelFlag) -> Run:
        return self.engine.generate(prepared.prompt_ids, config, prepared.media, cancel)

    def start_many(self, prepared: Prepared, configs: list[GenerationConfig], cancel: CancelFlag) -> list[Run]:
        """The choices of one request: one prefill, its KV shared
        (``LlamaChatModel.generate_many``)."""
        return self.engine.generate_many(prepared.prompt_ids, configs, prepared.media, cancel)

    def encode(self, texts: list[str], truncate: bool = False) -> Embeddings:
        return self.engine.encode(texts, truncate)

    def rerank(
        self,
        query: str,
        documents: list[str],
        cancel: CancelFlag,
        truncate: bool = False,
        max_doc_tokens: int | None = None,
    ) -> Ranking:
        return self.engine.rerank(query, documents, cancel, truncate, max_doc_tokens)

    def close(self) -> None:
        self.engine.close()

    async def aclose(self) -> None:
        """Nothing held on the loop (``close`` frees the engine)."""
