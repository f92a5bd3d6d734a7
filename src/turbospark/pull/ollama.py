"""Ollama's registry: a model is a manifest of layers fetched by digest; the
model layer is a GGUF, the template, params and system layers are small
texts kept as presets. The registry's address is
``TURBOSPARK_OLLAMA_REGISTRY`` (default Ollama's public one)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from .fetch import FetchError, Remote
from .refs import Reference

DEFAULT_REGISTRY = "https://registry.ollama.ai"
MANIFEST_TYPES = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
MODEL = "application/vnd.ollama.image.model"
PROJECTOR = "application/vnd.ollama.image.projector"
TEXTS = {
    "application/vnd.ollama.image.template": "template",
    "application/vnd.ollama.image.params": "params",
    "application/vnd.ollama.image.system": "system",
}
#: the most a text layer may be (a template or params, not weights)
TEXT_LIMIT = 1 << 20


def registry_url() -> str:
    return (os.environ.get("TURBOSPARK_OLLAMA_REGISTRY") or DEFAULT_REGISTRY).rstrip("/")


@dataclass(frozen=True)
class Layer:
    media_type: str
    digest: str
    size: int

    @property
    def hex(self) -> str:
        algo, _, value = self.digest.partition(":")
        if algo != "sha256" or len(value) != 64 or not all(c in "0123456789abcdef" for c in value):
            raise FetchError(f"the registry gave a digest this server does not take: {self.digest!r}")
        return value


@dataclass
class OllamaPlan:
    reference: Reference
    base: str
    model: Layer
    projector: Layer | None = None
    texts: dict[str, str] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)

    def blob(self, layer: Layer) -> Remote:
        return Remote(f"{self.base}/v2/{self.reference.repo}/blobs/{layer.digest}", layer.size, layer.hex)


def _layers(manifest: Any, name: str) -> list[Layer]:
    try:
        layers = [Layer(str(x["mediaType"]), str(x["digest"]), int(x["size"])) for x in manifest["layers"]]
    except (KeyError, TypeError, ValueError):
        raise FetchError(f"the registry's manifest for {name} is not one this server reads") from None
    for x in layers:  # (no file is 0 bytes or fewer: a GGUF, least of all)
        if x.size < 0 or (x.size == 0 and x.media_type in (MODEL, PROJECTOR)):
            kind = x.media_type.rsplit(".", 1)[-1]
            raise FetchError(f"{name}: the manifest's {kind} layer {x.digest} has size {x.size}; it is refused")
    return layers


def plan(ref: Reference, client: httpx.Client, base: str | None = None) -> OllamaPlan:
    """Read the manifest (and the small text layers)."""
    base = base or registry_url()
    url = f"{base}/v2/{ref.repo}/manifests/{ref.tag}"
    try:
        r = client.get(url, headers={"Accept": MANIFEST_TYPES}, follow_redirects=True)
    except httpx.TransportError as exc:
        raise FetchError(f"the Ollama registry at {base} cannot be reached: {exc}") from None
    if r.status_code == 404:
        raise FetchError(f"the Ollama registry has no model {ref.name!r}", 404)
    if r.status_code != 200:
        raise FetchError(f"the Ollama registry answered {r.status_code} for {ref.name}")
    try:
        layers = _layers(orjson.loads(r.content), ref.name)
    except orjson.JSONDecodeError:
        raise FetchError(f"the registry's manifest for {ref.name} is not JSON") from None
    models = [x for x in layers if x.media_type == MODEL]
    if len(models) != 1:
        raise FetchError(f"{ref.name}: the manifest has {len(models)} model layers; this server takes one")
    projector = next((x for x in layers if x.media_type == PROJECTOR), None)
    out = OllamaPlan(ref, base, models[0], projector)
    for layer in layers:
        key = TEXTS.get(layer.media_type)
        if key is not None and layer.size <= TEXT_LIMIT:
            out.texts[key] = _text(client, out, layer)
    if "params" in out.texts:
        try:
            params = orjson.loads(out.texts.pop("params"))
            out.params = params if isinstance(params, dict) else {}
        except orjson.JSONDecodeError:
            out.params = {}
    return out


def _text(client: httpx.Client, plan: OllamaPlan, layer: Layer) -> str:
    remote = plan.blob(layer)
    try:
        r = client.get(remote.url, follow_redirects=True)
    except httpx.TransportError as exc:
        raise FetchError(f"fetching {layer.digest} failed: {exc}") from None
    import hashlib

    if r.status_code != 200 or hashlib.sha256(r.content).hexdigest() != layer.hex:
        raise FetchError(f"{plan.reference.name}: layer {layer.digest} did not arrive intact")
    return r.content.decode("utf-8", "replace")


#: Ollama params that are presets here: name -> (preset key, type)
PARAM_PRESETS: dict[str, tuple[str, type]] = {
    "temperature": ("temperature", float),
    "top_p": ("top_p", float),
    "top_k": ("top_k", int),
    "min_p": ("min_p", float),
    "repeat_penalty": ("repeat_penalty", float),
    "presence_penalty": ("presence_penalty", float),
    "frequency_penalty": ("frequency_penalty", float),
    "seed": ("seed", int),
    "num_ctx": ("ctx", int),
}


def presets(params: dict[str, Any]) -> dict[str, Any]:
    """The params that map onto this server's presets (the rest are shown, not applied)."""
    out: dict[str, Any] = {}
    for name, (key, kind) in PARAM_PRESETS.items():
        value = params.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = kind(value)
    return out
