"""Media through the scheduler (issue 43, item 4) on the real bundled SmolLM2
with the tests' random projector (tests/mmproj.py): an image's embeddings fed
through the scheduler's own batches, its real token count in the KV and in
admission, prefix reuse keyed by the image's hash (no second encode), the host
tier keyed the same way and per owner, continuous batching beside text, and a
cancel that frees the slot. Random weights say nothing of quality: the tests
check counts, equality of what must be equal and difference of what must
differ."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from turbospark.engine import media

if not media.available():
    pytest.skip("this llama-cpp-python is built without libmtmd (scripts/llama-wheel.sh)", allow_module_level=True)

from turbospark.engine.model import LlamaChatModel, ModelOptions  # noqa: E402
from turbospark.engine.types import (  # noqa: E402
    MEDIA_MARKER,
    AdmissionError,
    CancelFlag,
    ContextOverflow,
    GenerationConfig,
    RawDecodeResult,
    StopReason,
)
from turbospark.models.catalog import resolve_model  # noqa: E402

from .media_samples import RED, STRIPED, png  # noqa: E402
from .mmproj import N_IMAGE_TOKENS, write_mmproj  # noqa: E402

QUESTION = (
    "<|im_start|>user\nLook at this: " + MEDIA_MARKER + " What is in the picture?<|im_end|>\n<|im_start|>assistant\n"
)
GREEN = png(32, 32, (30, 200, 60))


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-576.gguf")


def load(mmproj: Path, **kw: object) -> LlamaChatModel:
    path, _ = resolve_model("smollm2-135m")
    opts = ModelOptions(path=path, mmproj=str(mmproj), ctx=1024, threads=2, gpu_layers=0, cache_ram=64, **kw)  # type: ignore[arg-type]
    return LlamaChatModel(opts)


@pytest.fixture(scope="module")
def model(mmproj: Path) -> Iterator[LlamaChatModel]:
    m = load(mmproj, parallel=2, session_slots=4)
    yield m
    m.close()


def greedy(n: int = 8, owner: str = "") -> GenerationConfig:
    return GenerationConfig(max_new_tokens=n, temperature=0.0, ignore_eos=True, owner=owner, speculative=False)


def run(
    model: LlamaChatModel, text: str, images: list[bytes], config: GenerationConfig | None = None
) -> RawDecodeResult:
    prompt = model.media_prompt(text, images, chat=True)
    return asyncio.run(model.run_completion(prompt.ids, config, prompt, CancelFlag()))


def test_the_model_says_it_takes_images(model: LlamaChatModel) -> None:
    assert model.vision and not model.audio
    assert model.info()["modalities"] == {"vision": True, "audio": False}


def test_an_image_takes_its_real_token_count(model: LlamaChatModel) -> None:
    # (the image after a newline and before <|im_end|>: the text around it
    # tokenizes alike with or without it)
    text_only = model.render_chat([{"role": "user", "content": "What is in the picture?\n"}])
    chat = model.render_media_chat([{"role": "user", "content": f"What is in the picture?\n{MEDIA_MARKER}"}], [RED])
    assert [t for t in chat.ids if t >= 0] == text_only
    assert len(chat.ids) == len(text_only) + N_IMAGE_TOKENS
    prompt = model.media_prompt(QUESTION, [RED], chat=True)
    assert sum(1 for t in prompt.ids if t < 0) == N_IMAGE_TOKENS
    result = run(model, QUESTION, [RED], greedy(owner="count"))
    assert result.prompt_tokens == len(prompt.ids)
    assert (result.media_items, result.media_tokens, result.media_encoded) == (1, N_IMAGE_TOKENS, 1)
    assert result.media_encode_seconds > 0 and result.new_tokens == 8


def test_two_images_give_different_answers_and_one_image_the_same(model: LlamaChatModel) -> None:
    red = run(model, QUESTION, [RED], greedy(owner="a"))
    striped = run(model, QUESTION, [STRIPED], greedy(owner="b"))
    again = run(model, QUESTION, [RED], greedy(owner="c"))  # (another owner: nothing reused)
    assert again.reused_prefix_tokens == 0
    assert red.token_ids == again.token_ids
    assert red.token_ids != striped.token_ids


def test_a_follow_up_about_the_same_image_reuses_its_kv(model: LlamaChatModel) -> None:
    first = run(model, QUESTION, [RED], greedy(owner="follow"))
    follow = QUESTION + "It is red.<|im_end|>\n<|im_start|>user\nAre you sure?<|im_end|>\n<|im_start|>assistant\n"
    second = run(model, follow, [RED], greedy(owner="follow"))
    span = model.media_prompt(QUESTION, [RED], chat=True).spans[0]
    assert first.media_encoded == 1
    assert second.media_encoded == 0 and second.media_items == 1
    assert second.reused_prefix_tokens >= span.end
    # another image at the same place: reuse stops where it starts, and it is encoded
    third = run(model, follow, [GREEN], greedy(owner="follow"))
    assert third.reused_prefix_tokens <= span.start and third.media_encoded == 1


def test_reuse_never_ends_inside_an_image(model: LlamaChatModel) -> None:
    prompt = model.media_prompt(QUESTION, [RED], chat=True)
    span = prompt.spans[0]
    assert prompt.cut(span.start + 5) == span.start
    assert prompt.cut(span.end) == span.end and prompt.cut(span.start) == span.start


def test_an_image_runs_beside_text_and_answers_as_alone(model: LlamaChatModel) -> None:
    text_prompt = model.render_chat([{"role": "user", "content": "Count to ten, please."}])
    alone_text = asyncio.run(model.run_completion(text_prompt, greedy(12, "t1"), None, CancelFlag()))
    alone_image = run(model, QUESTION, [STRIPED], greedy(12, "i1"))

    async def both() -> tuple[RawDecodeResult, RawDecodeResult]:
        image_prompt = model.media_prompt(QUESTION, [STRIPED], chat=True)
        a = model.run_completion(text_prompt, greedy(12, "t2"), None, CancelFlag())
        b = model.run_completion(image_prompt.ids, greedy(12, "i2"), image_prompt, CancelFlag())
        return await asyncio.gather(a, b)

    text, image = asyncio.run(both())
    assert text.token_ids == alone_text.token_ids
    assert image.token_ids == alone_image.token_ids


def test_admission_counts_image_tokens(model: LlamaChatModel) -> None:
    prompt = model.media_prompt(QUESTION, [RED], chat=True)
    with pytest.raises(ContextOverflow):
        asyncio.run(model.run_completion(prompt.ids, greedy(1024 - len(prompt.ids) + 1), prompt, CancelFlag()))
    many = (MEDIA_MARKER + " ") * 70
    prompt = model.media_prompt(many, [RED] * 70, chat=False)
    assert len(prompt.ids) > 70 * N_IMAGE_TOKENS > 1024
    with pytest.raises(ContextOverflow):  # refused before any encode
        asyncio.run(model.run_completion(prompt.ids, greedy(1), prompt, CancelFlag()))


def test_ids_without_their_media_are_refused(model: LlamaChatModel) -> None:
    prompt = model.media_prompt(QUESTION, [RED], chat=True)
    with pytest.raises(AdmissionError, match="negative token"):
        asyncio.run(model.run_completion(prompt.ids, greedy(), None, CancelFlag()))


def test_a_cancel_before_the_encode_frees_the_slot(model: LlamaChatModel) -> None:
    async def cancelled() -> RawDecodeResult:
        prompt = model.media_prompt(QUESTION, [GREEN], chat=True)
        cancel = CancelFlag()
        run_ = model.generate(prompt.ids, greedy(owner="gone"), prompt, cancel)
        cancel.cancel("the client went away")
        return await run_.result()

    result = asyncio.run(cancelled())
    assert result.reason is StopReason.CANCELLED and result.media_encoded == 0
    assert model.load()["running"] == 0
    assert run(model, QUESTION, [GREEN], greedy(owner="after")).new_tokens == 8


def test_the_host_tier_keeps_an_image_by_its_hash_and_owner(mmproj: Path) -> None:
    m = load(mmproj, parallel=1, session_slots=1)
    # (long enough for the host tier: it restores from HOST_MIN_TOKENS on)
    question = "<|im_start|>system\n" + "You describe pictures carefully. " * 12 + "<|im_end|>\n" + QUESTION
    try:
        first = run(m, question, [RED], greedy(owner="alice"))
        other = m.render_chat([{"role": "user", "content": "Something else entirely."}])
        asyncio.run(m.run_completion(other, greedy(owner="bob"), None, CancelFlag()))  # evicts alice's slot
        back = run(m, question, [RED], greedy(owner="alice"))
        assert first.media_encoded == 1
        assert back.reused_from == "host" and back.media_encoded == 0
        assert back.token_ids == first.token_ids
        stranger = run(m, question, [RED], greedy(owner="mallory"))
        assert stranger.reused_prefix_tokens == 0 and stranger.media_encoded == 1
    finally:
        m.close()


def test_a_cancel_during_the_encode_frees_the_slot(model: LlamaChatModel) -> None:
    """The client leaves while the projector encodes (the engine thread is
    in libmtmd: the cancel lands as the encode returns); the sequence ends
    cancelled at the next step, its slot free and its record only what was
    fed before the image."""
    prompt = model.media_prompt(QUESTION, [png(20, 20, (90, 90, 9))], chat=True)
    cancel = CancelFlag()
    real = prompt.encode
    encoded: list[int] = []

    def encode_then_cancel(index: int) -> object:
        rows = real(index)
        encoded.append(index)
        cancel.cancel("the client went away")
        return rows

    prompt.encode = encode_then_cancel  # type: ignore[method-assign]

    async def go() -> RawDecodeResult:
        return await model.generate(prompt.ids, greedy(owner="leaver"), prompt, cancel).result()

    result = asyncio.run(go())
    assert encoded and result.reason is StopReason.CANCELLED and result.new_tokens == 0
    assert model.load()["running"] == 0
    slot = next(s for s in model.scheduler.slots if s.owner == "leaver")  # type: ignore[union-attr]
    assert not slot.busy and len(slot.tokens) <= prompt.spans[0].start
    assert run(model, QUESTION, [RED], greedy(owner="leaver")).new_tokens == 8
