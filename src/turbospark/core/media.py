"""A request's media checked before the engine decodes them (pure Python,
headers only): what each item is (an image or a sound, by its bytes' own
signature), and an image's declared size, so a decompression bomb (a tiny
PNG declaring 100 000 × 100 000 pixels, which stb_image would try to
allocate) is refused before libmtmd sees it. Formats: PNG, JPEG, GIF, BMP,
WebP images; WAV, MP3, FLAC sounds (what libmtmd's helper reads; any other
image format is refused here, so nothing unsized reaches the decoder).

Also :func:`without_media`: a request with the media a model cannot take
left out (a token count on a model without vision counts the text)."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Sequence

from ..engine.types import MEDIA_MARKER, AdmissionError
from .request import ChatRequest, Media

#: the most pixels one image may declare (8192 × 8192): decoded as RGB it
#: takes 200 MB before the projector resizes it
MAX_IMAGE_PIXELS = 8192 * 8192
#: the most pixels all images of one request may declare together
MAX_REQUEST_PIXELS = 4 * MAX_IMAGE_PIXELS
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WebP")
AUDIO_FORMATS = ("WAV", "MP3", "FLAC")


class MediaRefused(AdmissionError):
    """A media item refused before any work (a 400 naming its field)."""

    def __init__(self, message: str, param: str | None, code: str = "invalid_media") -> None:
        super().__init__(message, param)
        self.code = code


def sniff(data: bytes) -> tuple[str, str] | None:
    """(kind, format) of an item by its first bytes, or None: not a format
    taken here."""
    head = data[:16]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image", "PNG"
    if head.startswith(b"\xff\xd8\xff"):
        return "image", "JPEG"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "image", "GIF"
    if head.startswith(b"BM"):
        return "image", "BMP"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "image", "WebP"
    if head.startswith(b"RIFF") and head[8:12] == b"WAVE":
        return "audio", "WAV"
    if head.startswith(b"fLaC"):
        return "audio", "FLAC"
    if head.startswith(b"ID3") or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "audio", "MP3"
    return None


def _u16be(b: bytes, at: int) -> int:
    return int(struct.unpack_from(">H", b, at)[0])


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """The frame size of the first SOFn segment (markers C0-CF but C4, C8, CC)."""
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # (fill bytes)
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xDA)):  # standalone markers: no length
            i += 2
            continue
        length = _u16be(data, i + 2)
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 9 > len(data):
                return None
            return _u16be(data, i + 7), _u16be(data, i + 5)
        i += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        return int.from_bytes(data[26:28], "little") & 0x3FFF, int.from_bytes(data[28:30], "little") & 0x3FFF
    return None


def image_size(data: bytes, fmt: str) -> tuple[int, int] | None:
    """(width, height) an image's header declares, or None where the
    header is cut short or malformed."""
    try:
        if fmt == "PNG" and data[12:16] == b"IHDR":
            width, height = struct.unpack_from(">II", data, 16)
            return int(width), int(height)
        if fmt == "JPEG":
            return _jpeg_size(data)
        if fmt == "GIF":
            width, height = struct.unpack_from("<HH", data, 6)
            return int(width), int(height)
        if fmt == "BMP":
            if struct.unpack_from("<I", data, 14)[0] == 12:  # (OS/2 1.x: 16-bit sizes)
                width, height = struct.unpack_from("<HH", data, 18)
            else:
                width, height = struct.unpack_from("<ii", data, 18)
            return abs(int(width)), abs(int(height))
        if fmt == "WebP":
            return _webp_size(data)
    except struct.error:
        return None
    return None


def check_item(item: Media) -> int:
    """Refuse an item that is not what its field says, not a format taken
    here, or an image declaring too many pixels; returns its pixels (0 for
    a sound)."""
    where = item.field
    found = sniff(item.data)
    if found is None:
        raise MediaRefused(
            f"'{where}' is neither an image ({', '.join(IMAGE_FORMATS)}) nor a sound "
            f"({', '.join(AUDIO_FORMATS)}) this server reads",
            where,
        )
    kind, fmt = found
    if kind != item.kind:
        raise MediaRefused(f"'{where}' holds {_a(kind)} ({fmt}), not {_a(item.kind)}", where)
    if kind == "audio":
        return 0
    size = image_size(item.data, fmt)
    if size is None or 0 in size:
        raise MediaRefused(f"'{where}' is not a valid {fmt} image (its header gives no size)", where)
    width, height = size
    if width * height > MAX_IMAGE_PIXELS:
        raise MediaRefused(
            f"'{where}' declares {width} × {height} pixels; an image may have at most "
            f"{MAX_IMAGE_PIXELS:,} ({_side()} × {_side()}): send it smaller",
            where,
            "image_too_large",
        )
    return width * height


def _a(kind: str) -> str:
    return "a sound" if kind == "audio" else "an image"


def _side() -> int:
    return int(MAX_IMAGE_PIXELS**0.5)


def check_media(items: Sequence[Media]) -> None:
    """Every item checked (:func:`check_item`), and the pixels of all the
    request's images together bounded."""
    total = 0
    for item in items:
        total += check_item(item)
    if total > MAX_REQUEST_PIXELS:
        raise MediaRefused(
            f"the request's images declare {total:,} pixels together; at most {MAX_REQUEST_PIXELS:,} are taken",
            top_field(items[0].field),
            "image_too_large",
        )


def top_field(field: str) -> str:
    """``messages`` of ``messages[0].content[1].image_url``."""
    return field.split("[", 1)[0].split(".", 1)[0]


def without_media(req: ChatRequest, keep: Callable[[Media], bool]) -> ChatRequest:
    """``req`` with only the media ``keep`` says yes to: the others' markers
    taken out of the text (the same request otherwise; ``req`` is unchanged)."""
    if all(keep(m) for m in req.media):
        return req
    items = iter(req.media)
    kept: list[Media] = []

    def strip(text: str) -> str:
        pieces = text.split(MEDIA_MARKER)
        out = pieces[0]
        for piece in pieces[1:]:
            item = next(items, None)
            if item is not None and keep(item):
                kept.append(item)
                out += MEDIA_MARKER
            out += piece
        return out

    messages = [{**m, "content": strip(m["content"])} if isinstance(m.get("content"), str) else m for m in req.messages]
    prompt = strip(req.prompt) if req.prompt is not None else None
    return dataclasses.replace(req, messages=messages, prompt=prompt, media=kept)
