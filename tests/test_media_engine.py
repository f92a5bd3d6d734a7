"""engine/media.py (issue 43's groundwork): a projector loaded beside the
bundled SmolLM2-135M through llama.cpp's libmtmd, a prompt with a media
marker and a PNG turned into text and image chunks, an image chunk encoded
into embeddings of the text model's width; and the clear errors of a
projector for another width, bytes that are no image, and a marker count
that does not match.

The projectors are tests/mmproj.py's (vision) and tests/mmproj_audio.py's
(sound: a Whisper-style encoder with an Ultravox projector), generated once
per module (random weights: the embeddings mean nothing, their shape and
determinism do)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from turbospark.engine import media
from turbospark.engine.types import MEDIA_MARKER

if not media.available():
    pytest.skip("this llama-cpp-python is built without libmtmd (scripts/llama-wheel.sh)", allow_module_level=True)

from turbospark.engine.llama import LlamaModelFile  # noqa: E402
from turbospark.models.catalog import resolve_model  # noqa: E402

from .media_samples import NOISE_THEN_TONE, RED, STRIPED, TONE_THEN_NOISE, sine, wav  # noqa: E402
from .mmproj import N_IMAGE_TOKENS, write_mmproj  # noqa: E402
from .mmproj_audio import N_AUDIO_TOKENS, STACK, WINDOW_FRAMES, write_audio_mmproj  # noqa: E402


@pytest.fixture(scope="module")
def model() -> Iterator[LlamaModelFile]:
    path, _ = resolve_model("smollm2-135m")
    file = LlamaModelFile(path, n_gpu_layers=0)
    yield file
    file.close()


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-576.gguf")


@pytest.fixture(scope="module")
def projector(model: LlamaModelFile, mmproj: Path) -> Iterator[media.Projector]:
    with media.Projector(str(mmproj), model, n_threads=2, use_gpu=False) as proj:
        yield proj


def test_the_projector_loads_and_says_it_takes_images(projector: media.Projector) -> None:
    assert projector.vision and not projector.audio
    assert projector.n_embd == 576
    assert projector.marker == MEDIA_MARKER


def test_a_prompt_with_one_image_is_text_image_text(projector: media.Projector) -> None:
    prompt = f"Look: {projector.marker} What colour is it?"
    with projector.tokenize(prompt, [RED]) as tokenized:
        kinds = [c.kind for c in tokenized.chunks]
        assert kinds == ["text", "image", "text"]
        text0, image, text1 = tokenized.chunks
        assert image.n_tokens == N_IMAGE_TOKENS == 16
        assert image.id and len(image.id) == 64  # the bytes' SHA-256
        assert text0.n_tokens == len(text0.tokens) > 0 and text1.n_tokens == len(text1.tokens) > 0
        # the text around the marker is the model's own tokenization of it
        assert projector.model.detokenize(list(text1.tokens)).strip() == "What colour is it?"
        assert tokenized.n_tokens == text0.n_tokens + N_IMAGE_TOKENS + text1.n_tokens


def test_an_image_encodes_into_rows_of_the_models_width(projector: media.Projector) -> None:
    with projector.tokenize(f"{projector.marker} describe", [RED]) as tokenized:
        index = [c.kind for c in tokenized.chunks].index("image")
        embd = tokenized.encode(index)
        again = tokenized.encode(index)
    assert embd.shape == (N_IMAGE_TOKENS, 576) and embd.dtype == np.float32
    assert np.isfinite(embd).all() and float(np.abs(embd).max()) > 0
    np.testing.assert_array_equal(embd, again)  # the same image, the same embeddings

    with projector.tokenize(f"{projector.marker} describe", [STRIPED]) as other:
        assert other.chunks[index].n_tokens == N_IMAGE_TOKENS  # any size fits the projector's square
        assert not np.allclose(other.encode(index), embd)

    with pytest.raises(ValueError, match="text"):
        with projector.tokenize("no media here", []) as plain:
            assert [c.kind for c in plain.chunks] == ["text"]
            plain.encode(0)


def test_two_images_in_one_prompt(projector: media.Projector) -> None:
    m = projector.marker
    with projector.tokenize(f"first {m} then {m} compare", [RED, STRIPED]) as tokenized:
        images = [c for c in tokenized.chunks if c.kind == "image"]
        assert len(images) == 2 and images[0].id != images[1].id


def test_bytes_that_are_no_image_are_a_clear_error(projector: media.Projector) -> None:
    with pytest.raises(media.MediaError, match="media item 0 does not decode"):
        projector.tokenize(f"{projector.marker}", [b"this is not an image at all"])
    with pytest.raises(media.MediaError, match="media item 1 does not decode"):
        projector.tokenize(f"{projector.marker} {projector.marker}", [RED, RED[:40]])  # a cut PNG


def test_bytes_are_never_handed_to_a_video_decoder(projector: media.Projector) -> None:
    """The wheel is built with -DMTMD_VIDEO=OFF: with the video helpers, bytes
    that decode as neither image nor sound go to an ffprobe subprocess."""
    assert not media.mtmd().mtmd_helper_support_video(projector.ptr)


def test_a_marker_count_that_does_not_match_is_a_clear_error(projector: media.Projector) -> None:
    with pytest.raises(media.MediaError, match="1 media markers for 2 media items"):
        projector.tokenize(f"one {projector.marker}", [RED, RED])


def test_a_projector_for_another_width_does_not_load(model: LlamaModelFile, tmp_path: Path) -> None:
    other = write_mmproj(tmp_path / "mmproj-512.gguf", n_embd_text=512)
    with pytest.raises(media.ProjectorError, match="mismatch.*576.*512"):
        media.Projector(str(other), model, use_gpu=False)


def test_a_file_that_is_no_projector_does_not_load(model: LlamaModelFile, tmp_path: Path) -> None:
    with pytest.raises(media.ProjectorError, match="projector file not found"):
        media.Projector(str(tmp_path / "absent.gguf"), model, use_gpu=False)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(media.ProjectorError, match="does not load"):
        media.Projector(str(junk), model, use_gpu=False)
    # the text model itself is a GGUF but no projector
    with pytest.raises(media.ProjectorError, match="does not load"):
        media.Projector(model.path, model, use_gpu=False)


# -- sound ------------------------------------------------------------------


@pytest.fixture(scope="module")
def hearing(model: LlamaModelFile, tmp_path_factory: pytest.TempPathFactory) -> Iterator[media.Projector]:
    path = write_audio_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-audio-576.gguf")
    with media.Projector(str(path), model, n_threads=2, use_gpu=False) as proj:
        yield proj


def test_the_audio_projector_loads_and_says_it_takes_sound(hearing: media.Projector) -> None:
    assert hearing.audio and not hearing.vision
    assert hearing.n_embd == 576


def test_a_prompt_with_one_sound_is_text_audio_text(hearing: media.Projector) -> None:
    # 2 s at 16 kHz, padded with 30 s of silence: 32000 + 480000 samples, 10 ms
    # frames -> 3201 mel frames, one whole 3000-frame window (the 201-frame
    # tail is padding, dropped). The window: 3000 frames -> strided conv ->
    # 1500 positions -> stacked 20 at a time -> 75 embeddings.
    assert N_AUDIO_TOKENS == WINDOW_FRAMES // 2 // STACK == 75
    with hearing.tokenize(f"Listen: {hearing.marker} What is it?", [TONE_THEN_NOISE]) as tokenized:
        assert [c.kind for c in tokenized.chunks] == ["text", "audio", "text"]
        text0, audio, text1 = tokenized.chunks
        assert audio.n_tokens == N_AUDIO_TOKENS
        assert audio.id and len(audio.id) == 64  # the bytes' SHA-256
        assert hearing.model.detokenize(list(text1.tokens)).strip() == "What is it?"
        assert tokenized.n_tokens == text0.n_tokens + N_AUDIO_TOKENS + text1.n_tokens


def test_a_sound_encodes_into_rows_of_the_models_width(hearing: media.Projector) -> None:
    def embed(data: bytes) -> np.ndarray:
        with hearing.tokenize(f"{hearing.marker} transcribe", [data]) as tokenized:
            index = [c.kind for c in tokenized.chunks].index("audio")
            return tokenized.encode(index)

    embd = embed(TONE_THEN_NOISE)
    assert embd.shape == (N_AUDIO_TOKENS, 576) and embd.dtype == np.float32
    assert np.isfinite(embd).all() and float(np.abs(embd).max()) > 0
    np.testing.assert_array_equal(embd, embed(TONE_THEN_NOISE))  # the same sound, the same rows
    assert not np.allclose(embd, embed(NOISE_THEN_TONE))


def test_a_sound_over_30_seconds_is_one_audio_chunk_per_window(hearing: media.Projector) -> None:
    # 31 s + 30 s of padding: 6101 frames, two whole windows (the rest padding)
    with hearing.tokenize(f"{hearing.marker} summarise", [wav(sine(31.0))]) as tokenized:
        kinds = [(c.kind, c.n_tokens) for c in tokenized.chunks if c.kind != "text"]
        assert kinds == [("audio", N_AUDIO_TOKENS), ("audio", N_AUDIO_TOKENS)]


def test_bytes_that_are_no_sound_are_a_clear_error(hearing: media.Projector) -> None:
    m = hearing.marker
    with pytest.raises(media.MediaError, match="media item 0 does not decode"):
        hearing.tokenize(m, [b"this is not a sound at all"])
    with pytest.raises(media.MediaError, match="media item 0 does not decode"):
        hearing.tokenize(m, [TONE_THEN_NOISE[:40]])  # a cut WAV: its header only
    with pytest.raises(media.MediaError, match="media item 0 does not decode"):
        hearing.tokenize(m, [wav([])])  # a WAV of no samples
    with pytest.raises(media.MediaError, match="media item 0 is image, which this model does not take"):
        hearing.tokenize(m, [RED])


def test_a_one_sample_sound_is_a_clear_error_not_an_abort(hearing: media.Projector) -> None:
    """libmtmd asserts a sound has more than one sample: unguarded, this
    request would abort the process."""
    with pytest.raises(media.MediaError, match="one sample"):
        hearing.tokenize(hearing.marker, [wav([0.25])])
    with hearing.tokenize(hearing.marker, [wav([0.25, -0.25])]) as two:  # two samples: padded, heard
        assert [c.n_tokens for c in two.chunks if c.kind == "audio"] == [N_AUDIO_TOKENS]


def test_a_sound_for_a_projector_without_hearing_is_a_clear_error(projector: media.Projector) -> None:
    with pytest.raises(media.MediaError, match="media item 0 does not decode"):
        projector.tokenize(projector.marker, [TONE_THEN_NOISE])


def test_an_audio_projector_this_llama_cpp_would_abort_on_does_not_load(model: LlamaModelFile, tmp_path: Path) -> None:
    """Ultravox's own stack factor, 8: libmtmd counts ceil(3000 / 8) // 2 =
    187 tokens per window, its graph computes ceil(1500 / 8) = 188 rows, and
    the first encode aborts the process. Refused at load instead."""
    path = write_audio_mmproj(tmp_path / "mmproj-audio-stack8.gguf", stack=8)
    with pytest.raises(media.ProjectorError, match="stack factor 8 .* count 187 tokens .* compute 188"):
        media.Projector(str(path), model, use_gpu=False)
