"""Hugging Face: which files a reference means (the quant, every part of a
split model, an ``mmproj`` beside it), listed and addressed through
``huggingface_hub``, so ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HUB_OFFLINE``
and the proxies are honoured as in every other Hugging Face tool."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from . import fetch
from .fetch import FetchError, Remote
from .refs import DEFAULT_QUANT, Reference

_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
_QUANT = re.compile(r"^(I?Q\d(_[A-Z0-9]+)*|TQ\d_\d|F16|F32|BF16|MXFP4)$", re.IGNORECASE)


def endpoint_of(endpoint: str | None) -> str | None:
    """The hub to ask: the one given, else ``HF_ENDPOINT`` as it is now
    (``huggingface_hub`` reads it once, when first imported)."""
    return endpoint or os.environ.get("HF_ENDPOINT") or None


def _hub() -> None:
    """Before ``huggingface_hub`` is first imported: it reports which tool
    uses it unless told not to (a call home a local server does not make)."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


class NeedsQuant(ValueError):
    """The reference names no quant the repository has (the message lists them)."""


@dataclass(frozen=True)
class HfFile:
    path: str
    size: int | None
    sha256: str | None


@dataclass(frozen=True)
class HfPlan:
    reference: Reference  # with the quant chosen
    revision: str
    files: tuple[HfFile, ...]
    mmproj: HfFile | None


def quant_of(filename: str) -> str:
    """``Qwen2.5-0.5B-Instruct-Q4_K_M.gguf`` → ``Q4_K_M`` ("" when none)."""
    name = os.path.basename(filename)
    split = _SPLIT.match(name)
    stem = split.group("prefix") if split else name[: -len(".gguf")] if name.lower().endswith(".gguf") else name
    for token in reversed(re.split(r"[-.]", stem)):
        if _QUANT.match(token):
            return token.upper()
    return ""


def _listing(repo: str, endpoint: str | None) -> tuple[str, list[HfFile]]:
    _hub()
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError

    try:
        info = HfApi(endpoint=endpoint_of(endpoint)).model_info(repo, files_metadata=True)
    except RepositoryNotFoundError:
        missing = f"Hugging Face has no model repository {repo!r} (or it needs a token: HF_TOKEN)"
        raise FetchError(missing, 404) from None
    except OfflineModeIsEnabled:
        raise FetchError(f"{repo}: HF_HUB_OFFLINE is set, and the model is not in the store", 503) from None
    except (HfHubHTTPError, OSError) as exc:
        raise FetchError(f"listing {repo} on Hugging Face failed: {exc}") from None
    files = []
    for s in info.siblings or []:
        lfs: Any = s.lfs
        if all(_NAME.match(part) for part in s.rfilename.split("/")):  # (never a path outside the store)
            files.append(HfFile(s.rfilename, s.size, lfs.sha256 if lfs is not None else None))
    return str(info.sha or "main"), files


def _pick(ref: Reference, files: list[HfFile]) -> tuple[Reference, list[HfFile]]:
    """The model files a reference means (all parts of a split one)."""
    ggufs = [f for f in files if f.path.lower().endswith(".gguf") and "mmproj" not in os.path.basename(f.path).lower()]
    by_path = {f.path: f for f in ggufs}
    if ref.file:
        if ref.file not in by_path:
            raise NeedsQuant(f"{ref.repo} has no file {ref.file!r}; its GGUF files: {_names(ggufs)}")
        chosen = [by_path[ref.file]]
    else:
        quants = sorted({quant_of(f.path) for f in ggufs} - {""})
        want = ref.tag or (DEFAULT_QUANT if DEFAULT_QUANT in quants else "")
        if not want and len(ggufs) == 1:
            chosen = ggufs
        else:
            chosen = [f for f in ggufs if quant_of(f.path) == want]
        if not chosen:
            asked = f"no {ref.tag} file" if ref.tag else f"no {DEFAULT_QUANT} file, and no quant was named"
            raise NeedsQuant(
                f"{ref.repo} has {asked}; name one as {ref.repo}:QUANT. Quants there: {', '.join(quants) or 'none'}"
                f" (files: {_names(ggufs)})"
            )
        ref = ref.with_tag(want or quant_of(chosen[0].path))
    first = _SPLIT.match(os.path.basename(chosen[0].path))
    if first:  # every part of a split model, in order
        prefix = chosen[0].path[: -len(first.group(0))] + first.group("prefix")
        chosen = sorted(
            (f for f in ggufs if _SPLIT.match(os.path.basename(f.path)) and f.path.startswith(prefix)),
            key=lambda f: f.path,
        )
        if len(chosen) != int(first.group("count")):
            raise FetchError(f"{ref.repo}: {first.group('count')} parts expected, {len(chosen)} listed")
    elif len(chosen) > 1:
        raise NeedsQuant(f"{ref.repo} has several {ref.tag} files ({_names(chosen)}); name one as org/repo/file.gguf")
    return ref, chosen


def _names(files: list[HfFile]) -> str:
    return ", ".join(f.path for f in files[:20]) + (" …" if len(files) > 20 else "")


def plan(ref: Reference, endpoint: str | None = None, client: httpx.Client | None = None) -> HfPlan:
    """The files to fetch; those the listing gives no size or sha256 for (a
    mirror's) are asked for them (``client``: a HEAD each)."""
    revision, files = _listing(ref.repo, endpoint)
    ref, chosen = _pick(ref, files)
    projectors = sorted(
        (f for f in files if "mmproj" in os.path.basename(f.path).lower() and f.path.endswith(".gguf")),
        key=lambda f: (0 if "f16" in f.path.lower() else 1, f.path),
    )
    out = HfPlan(ref, revision, tuple(chosen), projectors[0] if projectors else None)
    if client is None:
        return out
    return HfPlan(
        ref,
        revision,
        tuple(_linked(out, f, client, endpoint) for f in chosen),
        _linked(out, out.mmproj, client, endpoint) if out.mmproj else None,
    )


def _url(plan: HfPlan, file: HfFile, endpoint: str | None) -> str:
    _hub()
    from huggingface_hub import hf_hub_url

    return str(hf_hub_url(plan.reference.repo, file.path, revision=plan.revision, endpoint=endpoint_of(endpoint)))


def _headers() -> dict[str, str]:
    _hub()
    from huggingface_hub.utils._headers import build_hf_headers

    return dict(build_hf_headers())


def _linked(plan: HfPlan, file: HfFile, client: httpx.Client, endpoint: str | None) -> HfFile:
    """A file whose listing lacks its size or sha256, completed from what the
    download itself says (``X-Linked-Size`` / ``X-Linked-Etag``, as
    ``huggingface_hub`` checks them; a plain file's ``Content-Length``)."""
    if file.size is not None and file.sha256 is not None:
        return file
    try:
        r = client.head(_url(plan, file, endpoint), headers=_headers(), follow_redirects=False)
    except httpx.TransportError:
        return file  # (the download will say what is wrong)
    if r.status_code >= 400:
        return file
    size, sha = file.size, file.sha256
    linked = r.headers.get("x-linked-size") or (r.headers.get("content-length") if r.status_code == 200 else None)
    if size is None and linked and linked.isdigit():
        size = int(linked)
    etag = (r.headers.get("x-linked-etag") or "").removeprefix("W/").strip('"').lower()
    if sha is None and len(etag) == 64 and all(c in "0123456789abcdef" for c in etag):
        sha = etag
    return HfFile(file.path, size, sha)


def download(
    plan: HfPlan,
    file: HfFile,
    target: str,
    partial: str,
    client: httpx.Client,
    progress: Callable[[int], None],
    endpoint: str | None,
    verifying: Callable[[], None],
    on_disk: Callable[[int], None],
) -> None:
    """One file: its URL and headers (``HF_TOKEN``, the user agent) from
    ``huggingface_hub``; the bytes through the pooled client, resumed from
    the bytes on disk. (``hf_hub_download`` starts over when a connection is
    reset, and its partial files are its own process's: a pull killed
    midway would fetch everything again.)"""
    remote = Remote(_url(plan, file, endpoint), file.size, file.sha256)
    headers = _headers()
    fetch.download(client, remote, partial, target, progress, headers=headers, verifying=verifying, on_disk=on_disk)
