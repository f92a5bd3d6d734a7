"""Images and sound as the dialects send them, into :class:`Media` items and
the markers standing for them in the text (pure; no fetching here): base64
fields, ``data:`` URLs, remote URLs (kept as ``Media(url=...)`` for the
server to fetch, only with ``--allow-media-urls``), and OpenAI-style content
parts (Chat Completions' ``image_url`` and ``input_audio``, Responses'
``input_image``) flattened into text with :data:`MEDIA_MARKER` where each
item stands. A malformed item is a 400 naming its place."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from ..core.media import sniff
from ..core.request import Media, media_text
from ..engine.types import MEDIA_MARKER
from .common import BadRequest

#: the sound formats OpenAI's ``input_audio`` names (and FLAC, which the
#: engine reads too)
AUDIO_FORMATS = ("wav", "mp3", "flac")
#: the roles whose content may hold media (a tool's result: a screenshot)
MEDIA_ROLES = ("user", "tool")
#: Ollama's image tags in a prompt: ``[img]`` (the next one), ``[img-N]``
_IMG_TAG = re.compile(r"\[img(?:-(\d{1,4}))?\]")


def decode_base64(text: str, where: str) -> bytes:
    """Base64 (line breaks and missing padding tolerated); anything else is
    a 400 naming ``where``."""
    data = "".join(text.split())
    try:
        out = base64.b64decode(data + "=" * (-len(data) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"'{where}' is not valid base64", where, code="invalid_media") from None
    if not out:
        raise BadRequest(f"'{where}' is empty", where, code="invalid_media")
    return out


def data_url(url: str, where: str, kind: str = "image") -> bytes:
    """The bytes of a ``data:`` URL of an image (``kind`` "audio": a sound),
    base64-encoded; another type (``text/html``) or encoding is a 400."""
    header, comma, payload = url[5:].partition(",")
    if not comma:
        raise BadRequest(f"'{where}' is not a valid data URL (no ',' before the data)", where, code="invalid_media")
    params = [p.strip().lower() for p in header.split(";")]
    mime = params[0] or "text/plain"
    if not mime.startswith(kind + "/"):
        expected = "image/png, image/jpeg, ..." if kind == "image" else "audio/wav, audio/mpeg, ..."
        raise BadRequest(
            f"'{where}' is a data URL of type {mime[:60]!r}; expected {_a(kind)} ({expected})",
            where,
            code="invalid_media",
        )
    if "base64" not in params[1:]:
        raise BadRequest(f"'{where}' must be a base64 data URL (data:{mime};base64,...)", where, code="invalid_media")
    return decode_base64(payload, where)


def _a(kind: str) -> str:
    return "a sound" if kind == "audio" else "an image"


def image_at(url: Any, where: str) -> Media:
    """An image named by a URL: a ``data:`` URL (decoded here) or an
    http(s) URL (fetched by the server, if it fetches any)."""
    if not isinstance(url, str) or not url:
        raise BadRequest(f"'{where}' must be a data URL or an http(s) URL", where)
    if url[:5].lower() == "data:":
        return Media("image", data_url(url, where), field=where)
    if url.lower().startswith(("https://", "http://")):
        return Media("image", url=url, field=where)
    raise BadRequest(f"'{where}' must be a data URL (data:image/png;base64,...) or an http(s) URL", where)


def sound_of(part: dict[str, Any], where: str) -> Media:
    """OpenAI's ``input_audio``: ``{"data": base64, "format": "wav" | "mp3"}``
    (Responses' older flat shape too: ``data`` and ``format`` on the part)."""
    audio = part.get("input_audio", part)
    if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
        raise BadRequest(f"'{where}.input_audio' must be an object with a base64 'data'", f"{where}.input_audio")
    at = f"{where}.input_audio" if "input_audio" in part else where
    fmt = audio.get("format")
    if fmt not in AUDIO_FORMATS:
        raise BadRequest(f"'{at}.format' must be one of: {', '.join(AUDIO_FORMATS)} (got {fmt!r})", f"{at}.format")
    data = audio["data"]
    raw = data_url(data, f"{at}.data", "audio") if data[:5].lower() == "data:" else decode_base64(data, f"{at}.data")
    return Media("audio", raw, field=f"{at}.data")


def _part_media(part: dict[str, Any], kind: str, where: str) -> Media:
    if kind == "image_url":  # Chat Completions: {"url", "detail"} (detail taken, no other sizing here)
        ref = part.get("image_url")
        url = ref.get("url") if isinstance(ref, dict) else ref
        if not isinstance(url, str):
            raise BadRequest(f"'{where}.image_url' must be an object with a string 'url'", f"{where}.image_url")
        return image_at(url, f"{where}.image_url")
    if kind == "input_image":  # Responses: "image_url" (a URL) or "file_id"
        for name in ("image_url", "file_id"):
            if part.get(name) is not None and not isinstance(part[name], str):
                raise BadRequest(f"'{where}.{name}' must be a string", f"{where}.{name}")
        if part.get("image_url") is None:
            if part.get("file_id") is not None:
                raise BadRequest(
                    f"'{where}.file_id': there is no files API on this server; send the image as "
                    "'image_url' (a data URL)",
                    f"{where}.file_id",
                )
            raise BadRequest(f"'{where}' needs an 'image_url' or a 'file_id'", f"{where}.image_url")
        return image_at(part["image_url"], f"{where}.image_url")
    return sound_of(part, where)


def content_text(content: Any, media: list[Media], where: str = "content", role: str = "user") -> str:
    """OpenAI-style content (a string, or a list of typed parts) as text:
    text parts as they are (a copy of the marker broken), each image or
    sound part a :data:`MEDIA_MARKER` there, its item appended to ``media``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return media_text(content)
    if not isinstance(content, list):
        raise BadRequest(f"'{where}' must be a string or a list of content parts", where)
    out: list[str] = []
    for i, part in enumerate(content):
        at = f"{where}[{i}]"
        if isinstance(part, str):
            out.append(media_text(part))
            continue
        if not isinstance(part, dict):
            raise BadRequest(f"'{at}' must be an object", at)
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text"):
            text = part.get("text")
            if not isinstance(text, str):
                raise BadRequest(f"'{at}.text' must be a string", f"{at}.text")
            out.append(media_text(text))
        elif kind in ("image_url", "input_image", "input_audio"):
            if role not in MEDIA_ROLES:
                raise BadRequest(
                    f"'{at}': images and sounds go in user messages (or tool results), not in a {role} message",
                    f"{at}.type",
                )
            media.append(_part_media(part, kind, at))
            out.append(MEDIA_MARKER)
        else:
            raise BadRequest(f"unsupported content part type {kind!r} in '{at}'", f"{at}.type")
    return "".join(out)


def placed(text: str, items: list[Media]) -> tuple[str, list[Media]]:
    """Ollama's placement of a message's images: an ``[img]`` tag in the
    text is the next image's place, an ``[img-N]`` tag image N's; the images
    left over go before the text, in order (as Ollama lays them out).
    Returns the text with markers and the items in their markers' order."""
    used: list[int] = []

    def place(match: re.Match[str]) -> str:
        index = match.group(1)
        n = int(index) if index is not None else next((k for k in range(len(items)) if k not in used), -1)
        if not 0 <= n < len(items) or n in used:
            return match.group(0)
        used.append(n)
        return MEDIA_MARKER

    body = _IMG_TAG.sub(place, text)
    rest = [k for k in range(len(items)) if k not in used]
    return MEDIA_MARKER * len(rest) + body, [items[k] for k in rest + used]


def base64_item(text: str, where: str) -> Media:
    """An item given as bare base64 (Ollama's ``images``, llama-server's
    ``multimodal_data``; a ``data:`` URL prefix tolerated), an image or a
    sound by its bytes."""
    data = text.split(",", 1)[1] if text[:5].lower() == "data:" and "," in text else text
    raw = decode_base64(data, where)
    found = sniff(raw)
    return Media(found[0] if found is not None else "image", raw, field=where)
