"""A scripted model for the edge cases a real model cannot be made to produce
(an engine failure mid-stream, a particular tool-call syntax). Never the only
test of a feature: every feature is also tested on the real model."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from turbospark.engine.channel import Channel, Run
from turbospark.engine.types import (
    AdmissionError,
    CancelFlag,
    EngineError,
    GenerationConfig,
    Progress,
    RawDecodeResult,
    StopReason,
)


@dataclass
class Script:
    """What the next generation produces: text pieces, then an ending."""

    pieces: list[str]
    reason: StopReason = StopReason.END_OF_TURN
    fail_after: int | None = None  # raise EngineError after this many pieces
    delay: float = 0.0


@dataclass
class ScriptedModel:
    """Implements the model interface (engine/interface.py) from scripts.

    Tokenization is one token per whitespace-separated word, so counts are
    predictable. Each call to ``generate`` pops the next script (the
    last one repeats)."""

    model_id: str = "scripted"
    aliases: tuple[str, ...] = ()
    scripts: list[Script] = field(default_factory=lambda: [Script(["Hello", " world"])])
    supports_chat: bool = True
    supports_embeddings: bool = False
    supports_rerank: bool = False
    vision: bool = False
    audio: bool = False
    default_reasoning: Any = None
    default_system: str | None = None
    default_sampling: dict[str, Any] = field(default_factory=dict)
    context: int = 4096
    #: the chat template's source as the engine would report it (only read
    #: for what it mentions: thinking, tools)
    chat_template: str = ""
    #: scripts are played as written, whatever grammar is asked for; True
    #: stands in for an engine that enforces it (the script must obey it)
    enforces_grammars: bool = False
    calls: list[dict[str, Any]] = field(default_factory=list)
    _tasks: set[Any] = field(default_factory=set, repr=False)

    @property
    def template_source(self) -> str:
        return self.chat_template

    @property
    def fim_tokens(self) -> dict[str, int]:
        return {}  # no fill-in-the-middle

    @property
    def marked_tokens(self) -> dict[str, int]:
        return {}

    @property
    def leading_bos(self) -> tuple[int, ...]:
        return ()

    @property
    def eog_tokens(self) -> tuple[int, ...]:
        return ()

    failure: str | None = None

    def stalled_for(self) -> float:
        return 0.0

    def compile_grammar(self, grammar: str, trigger: str | None = None) -> None:
        """Scripts are played as written: nothing to compile."""

    def close(self) -> None:
        pass

    @property
    def vocab_size(self) -> int:
        return 1000

    @property
    def max_context(self) -> int:
        return self.context

    def info(self) -> dict[str, Any]:
        return {
            "id": self.model_id,
            "context": self.context,
            "parameters": 0,
            "size_bytes": 0,
            "architecture": "scripted",
            "description": "scripted test model",
            "aliases": list(self.aliases),
            "parallel": 1,
            "session_slots": 1,
            "chat_template": self.chat_template,
            "quantization": "",
        }

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return [hash(w) % 1000 for w in text.split()]

    def detokenize(self, tokens: list[int]) -> str:
        return " ".join(str(t) for t in tokens)

    def chat_text(self, messages: list[dict[str, Any]], tools: Any = None, **kw: Any) -> str:
        return " ".join(f"<{m['role']}> {m.get('content') or ''}" for m in messages) + " <assistant>"

    def render_chat(self, messages: list[dict[str, Any]], tools: Any = None, **kw: Any) -> list[int]:
        self.calls.append({"messages": messages, "tools": tools, **kw})
        return self.tokenize(self.chat_text(messages, tools))

    def prompt_ids(self, text: str) -> list[int]:
        self.calls.append({"prompt": text})
        return self.tokenize(text) or [0]

    def check_admission(self, n_prompt: int, max_new: int) -> None:
        if n_prompt + max_new > self.context:
            raise AdmissionError(f"{n_prompt} + {max_new} > {self.context}", "max_tokens")

    def default_max_new(self, n_prompt: int, default: int) -> int:
        return max(1, min(default, self.context - n_prompt))

    def load(self) -> dict[str, Any]:
        return {"running": 0, "waiting": 0, "slots": []}

    def slot_control(self) -> None:
        return None  # no KV, no slots

    def reserve(self, config: GenerationConfig) -> Any:
        return lambda: None  # no wait list: every run starts at once

    def encode(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        raise AdmissionError("the scripted model does not embed", "model")

    def rerank(self, query: str, documents: list[str], cancel: Any, truncate: bool = False, max_doc_tokens: Any = None):
        raise AdmissionError("the scripted model does not rerank", "model")

    def media_prompt(self, text: str, media: list[bytes], chat: bool) -> Any:
        raise AdmissionError("the scripted model takes no media", "messages")

    def render_media_chat(self, messages: Any, media: list[bytes], tools: Any = None, **kw: Any) -> Any:
        raise AdmissionError("the scripted model takes no media", "messages")

    def generate(self, prompt_ids: list[int], config: GenerationConfig, media: Any, cancel: CancelFlag) -> Run:
        """Plays the next script on a task feeding the same channel the
        scheduler thread feeds."""
        channel = Channel(asyncio.get_running_loop())
        task = asyncio.ensure_future(self._play(prompt_ids, config, cancel, channel.put))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return Run(channel)

    def generate_many(
        self, prompt_ids: list[int], configs: list[GenerationConfig], media: Any, cancel: CancelFlag
    ) -> list[Run]:
        """No shared prefill: one script played per choice."""
        return [self.generate(prompt_ids, config, media, cancel) for config in configs]

    async def _play(
        self, prompt_ids: list[int], config: GenerationConfig, cancel: CancelFlag, put: Callable[[Any], None]
    ) -> None:
        try:
            put(await self._script(prompt_ids, config, cancel, put))
        except Exception as exc:
            put(exc)

    async def _script(
        self, prompt_ids: list[int], config: GenerationConfig, cancel: CancelFlag, on_progress: Callable[[Any], None]
    ) -> RawDecodeResult:
        script = self.scripts.pop(0) if len(self.scripts) > 1 else self.scripts[0]
        if self.calls:
            self.calls[-1]["config"] = config
        out: list[str] = []
        reason = script.reason
        for i, piece in enumerate(script.pieces):
            if script.fail_after is not None and i >= script.fail_after:
                raise EngineError("scripted failure mid-generation")
            if cancel.cancelled:
                reason = StopReason.CANCELLED
                break
            if len(out) >= config.max_new_tokens:
                reason = StopReason.MAX_TOKENS
                break
            if script.delay:
                await asyncio.sleep(script.delay)
            out.append(piece)
            on_progress(Progress(piece, 1))
        else:
            if script.fail_after is not None and script.fail_after >= len(script.pieces):
                raise EngineError("scripted failure at the end of generation")
        return RawDecodeResult(
            prompt_tokens=len(prompt_ids),
            new_tokens=len(out),
            prefill_seconds=0.001,
            decode_seconds=0.001 * max(1, len(out)),
            reason=reason,
            text="".join(out),
        )
