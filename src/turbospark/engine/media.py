"""Images and sound in: a thin layer over llama.cpp's libmtmd (llama-cpp-python's
``llama_cpp.mtmd_cpp`` bindings).

A :class:`Projector` is a multimodal projector GGUF (an "mmproj") loaded beside
a loaded text model: it says what it takes (vision, audio) and turns a prompt
whose text holds the media marker once per item, plus the items' encoded
bytes (PNG, JPEG, ... for images; WAV, MP3, FLAC for sound), into a
:class:`MediaPrompt`: chunks of text tokens and media tokens. A media chunk
encodes into its embeddings, one row of the text model's width per token,
which the text model then takes in place of token ids.

Errors: :class:`ProjectorError` for a projector that does not load, or does
not fit its model (another embedding width), or one this llama.cpp would
abort on (an audio encoder's frame stacking it miscounts), or a
llama-cpp-python built without libmtmd; :class:`MediaError` (an
:class:`AdmissionError`, a clean 400 upstream) for bytes that do not decode,
a sound too short for libmtmd, or a marker count that does not match.
A sound is one audio chunk per 30 s window (a longer one is several).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np

from .gguf import NotGGUF, check
from .llama import LlamaModelFile, default_threads, init_backend, lib
from .types import MEDIA_MARKER, AdmissionError

log = logging.getLogger("turbospark.engine")

#: mtmd_input_chunk_type
CHUNK_KINDS = {0: "text", 1: "image", 2: "audio"}
#: projector types whose Whisper-style audio encoder stacks frames
#: (clip-model.h's audio_has_stack_frames)
STACKING_TYPES = ("ultravox", "voxtral", "meralion")
#: a Whisper window: 30 s of 10 ms mel frames (mtmd-audio.cpp), halved by
#: the encoder's strided convolution
WHISPER_FRAMES = 3000

_load_lock = threading.Lock()  # one projector loads at a time: its errors are read from the log
_log_lock = threading.Lock()
_log_ready = False
_log_callback = None  # kept referenced: libmtmd holds the raw pointer
_errors: list[str] | None = None  # error lines while a projector loads


class ProjectorError(RuntimeError):
    """A projector that cannot be used with this model (or at all). Its
    message names the file by its path (for the operator); ``public`` says
    the same naming it by its file name only (for a client: no folder of
    the server's)."""

    def __init__(self, message: str, public: str | None = None) -> None:
        super().__init__(message)
        self.public = public or message


def _refused(path: str, why: str) -> ProjectorError:
    """``the projector PATH WHY``; its public form names the file only."""
    return ProjectorError(f"the projector {path} {why}", f"the projector {os.path.basename(path)} {why}")


class MediaError(AdmissionError):
    """Media bytes, or a prompt, that the projector refuses (``index``: the
    item's, where one item is refused)."""

    def __init__(self, message: str, param: str | None = None, index: int | None = None) -> None:
        super().__init__(message, param)
        self.index = index


def mtmd() -> Any:
    """llama-cpp-python's libmtmd bindings; a :class:`ProjectorError` where
    the installed wheel was built without libmtmd (``-DLLAVA_BUILD=OFF``)."""
    try:
        from llama_cpp import mtmd_cpp
    except (OSError, RuntimeError) as e:  # FileNotFoundError: no libmtmd.so
        raise ProjectorError(f"this llama-cpp-python has no libmtmd (media input): {e}") from None
    return mtmd_cpp


def available() -> bool:
    """Whether the installed llama-cpp-python carries libmtmd."""
    try:
        mtmd()
    except ProjectorError:
        return False
    return True


def _route_log(M: Any) -> None:
    """libmtmd (and its clip) log through our logger, as llama.cpp does; the
    error lines of a load in progress are kept for its exception."""
    global _log_ready, _log_callback
    with _log_lock:
        if _log_ready:
            return
        log_callback: Callable[[Callable[[int, bytes, object], None]], Any] = lib().llama_log_callback
        mlog = logging.getLogger("turbospark.llama")

        @log_callback
        def _cb(level: int, text: bytes, _user: object) -> None:  # pragma: no cover - C callback
            msg = text.decode("utf-8", "replace").rstrip()
            if not msg:
                return
            if level == 4:  # GGML_LOG_LEVEL_ERROR
                if _errors is not None:
                    _errors.append(msg)
                mlog.error("%s", msg)
            else:
                mlog.debug("%s", msg)

        _log_callback = _cb
        M.mtmd_helper_log_set(_cb, ctypes.c_void_p(0))
        _log_ready = True


@dataclass(frozen=True)
class Span:
    """Where one media chunk stands in a prompt's ids: positions
    ``[start, end)`` hold its placeholders (see :func:`placeholders`)."""

    start: int
    end: int
    kind: str
    #: the SHA-256 of the item's bytes
    id: str
    #: its index among the prompt's chunks (what :meth:`MediaPrompt.encode` takes)
    chunk: int
    #: decoded whole, with causal attention off (Gemma 3's images)
    non_causal: bool = False

    @property
    def n_tokens(self) -> int:
        return self.end - self.start


def placeholders(media_id: str, n: int) -> list[int]:
    """The ids standing for a media chunk's ``n`` tokens in a prompt's ids:
    negative (never a vocabulary token), int32 (the host tier keeps records
    as int32), and drawn from the item's hash, so a record of the same item
    at the same place matches it token by token (prefix reuse, the host tier,
    ``--cache-dir`` across restarts) and another item's does not."""
    seed = int(media_id[:32], 16) if media_id else 0
    draws = np.random.default_rng(seed).integers(1, 2**31 - 1, size=n, dtype=np.int64)
    return [-int(v) for v in draws]


@dataclass(frozen=True)
class Chunk:
    """One piece of a tokenized media prompt."""

    kind: str  # "text", "image" or "audio"
    n_tokens: int
    #: a text chunk's token ids (empty for media)
    tokens: tuple[int, ...] = ()
    #: a media chunk's id: the SHA-256 of its bytes (None for text)
    id: str | None = None


class Projector:
    """A multimodal projector loaded for one loaded text model."""

    def __init__(
        self,
        path: str,
        model: LlamaModelFile,
        n_threads: int = 0,
        use_gpu: bool | None = None,
        marker: str = MEDIA_MARKER,
    ) -> None:
        if not os.path.isfile(path):
            name = os.path.basename(path)
            raise ProjectorError(f"projector file not found: {path}", f"projector file not found: {name}")
        _check_projector(path)
        init_backend()
        M = mtmd()
        _route_log(M)
        self.model = model
        params = M.mtmd_context_params_default()
        # None: offload where this llama.cpp build can (a CPU build cannot)
        params.use_gpu = bool(lib().llama_supports_gpu_offload()) if use_gpu is None else use_gpu
        params.n_threads = n_threads or default_threads()
        params.print_timings = False
        self._marker = marker.encode()
        params.media_marker = self._marker
        self.ptr = self._load(M, path, params)
        self._encode_lock = threading.Lock()
        self.vision = bool(M.mtmd_support_vision(self.ptr))
        self.audio = bool(M.mtmd_support_audio(self.ptr))
        if M.mtmd_decode_use_mrope(self.ptr):
            # (Qwen2-VL-style models place image tokens by 2-D positions the
            # scheduler's batches do not carry)
            self.close()
            raise _refused(path, "needs M-RoPE positions (Qwen2-VL style), which turbospark does not feed yet")
        #: the marker that stands for one media item in a prompt's text
        self.marker = self._marker.decode()
        #: the width of one media embedding: the text model's input width
        self.n_embd = int(lib().llama_model_n_embd_inp(model.ptr))

    def _load(self, M: Any, path: str, params: Any) -> Any:
        global _errors
        with _load_lock:
            errors: list[str] = []
            _errors = errors
            try:
                ptr = M.mtmd_init_from_file(path.encode(), self.model.ptr, params)
            finally:
                _errors = None
        if not ptr:
            # libmtmd says why in its log (clip's loader, or the width check):
            # the first line of each error, once
            lines = [e.splitlines()[0].split("error: ", 1)[-1] for e in errors]
            why = "; ".join(dict.fromkeys(lines)) or "unknown error"
            # (clip's own lines may name the file: the client's form names no folder)
            plain = why.replace(os.path.dirname(path) + os.sep, "")
            raise ProjectorError(
                f"the projector {path} does not load beside {self.model.path}: {why}",
                f"the projector {os.path.basename(path)} does not load beside this model: {plain}",
            )
        return ptr

    def tokenize(
        self, prompt: str, media: Sequence[bytes], add_special: bool = True, parse_special: bool = True
    ) -> MediaPrompt:
        """Chunks for ``prompt`` with ``media[i]`` in place of its i-th marker."""
        n_markers = prompt.count(self.marker)
        if n_markers != len(media):
            raise MediaError(f"the prompt has {n_markers} media markers for {len(media)} media items")
        M = mtmd()
        bitmaps: list[Any] = []
        try:
            for i, data in enumerate(media):
                bitmaps.append(self._bitmap(M, data, i))
            chunks = M.mtmd_input_chunks_init()
            text_bytes = prompt.encode()
            text = M.mtmd_input_text(text_bytes, len(text_bytes), add_special, parse_special)
            array = (M.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            rc = M.mtmd_tokenize(self.ptr, chunks, ctypes.byref(text), array, len(bitmaps))
            if rc != 0:
                M.mtmd_input_chunks_free(chunks)
                raise MediaError(f"the media could not be prepared for this model (mtmd_tokenize: {rc})")
            return MediaPrompt(self, chunks)
        finally:
            for bitmap in bitmaps:
                M.mtmd_bitmap_free(bitmap)

    def prompt(self, text: str, media: Sequence[bytes], add_bos: bool, chat: bool, batch: int) -> MediaPrompt:
        """:meth:`tokenize` for a model whose batches hold ``batch`` tokens:
        a chunk decoded whole (non-causal) must fit one (0: unchecked)."""
        prompt = self.tokenize(text, media, add_special=add_bos, parse_special=chat)
        big = next((s for s in prompt.spans if s.non_causal and s.n_tokens > batch), None) if batch else None
        if big is not None:
            prompt.close()
            raise MediaError(
                f"a media item of {big.n_tokens} tokens is decoded whole, "
                f"which needs --batch of at least that (it is {batch})"
            )
        return prompt

    def _bitmap(self, M: Any, data: bytes, index: int) -> Any:
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = M.mtmd_helper_bitmap_init_from_buf(self.ptr, buf, len(data), False)
        if not bitmap:
            # libmtmd's helper: images stb_image reads (PNG, JPEG, GIF, BMP, ...);
            # sound as WAV, MP3 or FLAC, where the projector takes sound (a
            # sound of no samples does not decode either)
            raise MediaError(f"media item {index} does not decode as an image or sound this model takes", index=index)
        # its id: the bytes' hash (the chunk's, and its placeholders' seed)
        M.mtmd_bitmap_set_id(bitmap, hashlib.sha256(data).hexdigest().encode())
        kind = "audio" if M.mtmd_bitmap_is_audio(bitmap) else "image"
        why = None
        if (kind == "audio" and not self.audio) or (kind == "image" and not self.vision):
            why = f"media item {index} is {kind}, which this model does not take"
        elif kind == "audio" and M.mtmd_bitmap_get_nx(bitmap) < 2:
            # mtmd_tokenize asserts more than one sample (mtmd.cpp: GGML_ASSERT(buf.size()
            # > sizeof(float))): a one-sample WAV would abort the process
            why = f"media item {index} is a sound of one sample, too short to hear"
        if why:
            M.mtmd_bitmap_free(bitmap)
            raise MediaError(why, index=index)
        return bitmap

    def close(self) -> None:
        if getattr(self, "ptr", None):
            mtmd().mtmd_free(self.ptr)
            self.ptr = None

    def __enter__(self) -> Projector:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


def check_ids(prompt_ids: list[int], media: MediaPrompt | None, projector: Projector | None) -> None:
    """A prompt's ids go with their media: the ones this model's projector
    prepared for exactly these ids, and no placeholder without them."""
    if media is not None and (media.projector is not projector or media.ids != prompt_ids):
        raise AdmissionError("the prompt's media were prepared for another model or prompt", "messages")
    if media is None and any(t < 0 for t in prompt_ids):
        raise AdmissionError("the prompt names a negative token id", "prompt")


def _check_projector(path: str) -> None:
    """Refuse, at load, a projector libmtmd would load and then abort the
    process on. For a frame-stacking audio projector of stack factor ``s``,
    libmtmd counts a Whisper window's tokens as ``ceil(3000 / s) // 2``
    (clip.cpp's clip_n_output_tokens) while its graph yields ``ceil(1500 /
    s)`` rows; where they differ (``s`` = 8, Ultravox's own: 187 and 188)
    the first encode ends in GGML_ABORT("Invalid number of output tokens")."""
    try:
        meta = check(path).meta
    except NotGGUF as e:
        raise _refused(path, f"does not load: {e}") from None
    if not meta.get("clip.has_audio_encoder"):
        return
    kind = meta.get("clip.projector_type") or meta.get("clip.audio.projector_type")
    stack = meta.get("clip.audio.projector.stack_factor")
    if kind not in STACKING_TYPES or not isinstance(stack, int) or stack <= 0:
        return
    counted = -(-WHISPER_FRAMES // stack) // 2
    computed = -(-(WHISPER_FRAMES // 2) // stack)
    if counted != computed:
        raise _refused(
            path,
            f"does not load: its {kind} audio encoder's stack factor {stack} "
            f"makes this llama.cpp count {counted} tokens per 30 s window but compute {computed}",
        )


class MediaPrompt:
    """A tokenized media prompt: its chunks, each media chunk encodable. Owns
    libmtmd's chunk list; close it (or use it as a context manager)."""

    def __init__(self, projector: Projector, ptr: Any) -> None:
        self.projector = projector
        self.ptr = ptr
        M = mtmd()
        self.chunks: list[Chunk] = [self._chunk(M, i) for i in range(M.mtmd_input_chunks_size(ptr))]
        #: the prompt's ids: text tokens, and placeholders where media goes
        self.ids: list[int] = []
        #: where each media chunk stands in ``ids``
        self.spans: list[Span] = []
        for i, c in enumerate(self.chunks):
            if c.kind == "text":
                self.ids.extend(c.tokens)
                continue
            media_id = c.id or ""
            whole = bool(M.mtmd_decode_use_non_causal(projector.ptr, M.mtmd_input_chunks_get(ptr, i)))
            self.spans.append(Span(len(self.ids), len(self.ids) + c.n_tokens, c.kind, media_id, i, whole))
            self.ids.extend(placeholders(media_id, c.n_tokens))

    @property
    def media_tokens(self) -> int:
        return sum(s.n_tokens for s in self.spans)

    def span_at(self, pos: int) -> Span | None:
        """The media span holding position ``pos``, if any."""
        for s in self.spans:
            if s.start <= pos < s.end:
                return s
        return None

    def cut(self, n: int) -> int:
        """``n`` reused positions, moved back to the start of a media chunk
        they end inside (a chunk is fed whole: a non-causal one must be, and
        a record cut inside one is rare enough not to keep)."""
        span = self.span_at(n) if n > 0 else None
        return span.start if span is not None and span.start < n else n

    def _chunk(self, M: Any, index: int) -> Chunk:
        chunk = M.mtmd_input_chunks_get(self.ptr, index)
        kind = CHUNK_KINDS.get(int(M.mtmd_input_chunk_get_type(chunk)), "unknown")
        n_tokens = int(M.mtmd_input_chunk_get_n_tokens(chunk))
        if kind != "text":
            raw_id = M.mtmd_input_chunk_get_id(chunk)
            return Chunk(kind, n_tokens, id=raw_id.decode() if raw_id else None)
        n = ctypes.c_size_t(0)
        tokens = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
        return Chunk(kind, n_tokens, tuple(tokens[: n.value]) if tokens else ())

    @property
    def n_tokens(self) -> int:
        return sum(c.n_tokens for c in self.chunks)

    def encode(self, index: int) -> np.ndarray:
        """The embeddings of media chunk ``index``: float32, (n_tokens, n_embd)."""
        chunk_info = self.chunks[index]
        if chunk_info.kind == "text":
            raise ValueError(f"chunk {index} is text; only media chunks encode")
        M = mtmd()
        chunk = M.mtmd_input_chunks_get(self.ptr, index)
        proj = self.projector
        with proj._encode_lock:  # the output buffer is the context's, until the next encode
            rc = M.mtmd_encode_chunk(proj.ptr, chunk)
            if rc != 0:
                raise MediaError(f"media chunk {index} did not encode (mtmd_encode_chunk: {rc})")
            out = M.mtmd_get_output_embd(proj.ptr)
            embd = np.ctypeslib.as_array(out, shape=(chunk_info.n_tokens, proj.n_embd)).copy()
        return embd

    def close(self) -> None:
        if getattr(self, "ptr", None):
            mtmd().mtmd_input_chunks_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:  # (a request's prompt is dropped with it)
        try:
            self.close()
        except Exception:  # noqa: BLE001 - (at interpreter exit)
            pass

    def __enter__(self) -> MediaPrompt:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()
