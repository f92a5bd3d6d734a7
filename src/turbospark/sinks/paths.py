"""Raw request paths to route templates, for labels and span attributes.

Events carry the raw path (``/v1/models/smollm2-135m``). A metric label with
raw paths grows without bound (every model id, every typo a scanner sends),
so sinks label by the route template the app matched (``/v1/models/{model_id:path}``)
and put everything no route takes under one value, :data:`UNMATCHED`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from typing import Any

#: The label of a path no route takes (404s from scanners, typos).
UNMATCHED = "other"
#: Methods kept as label values; anything else is folded into ``other``.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RouteTemplates:
    """Matches a path against a route table: exact lookups for static paths,
    regexes only for the few templated ones."""

    def __init__(self, routes: Iterable[Any]) -> None:
        self._static: dict[str, str] = {}
        self._patterns: list[tuple[re.Pattern[str], str]] = []
        for route in routes:
            path = getattr(route, "path", None)
            regex = getattr(route, "path_regex", None)
            if not isinstance(path, str):
                continue
            if "{" in path and regex is not None:
                self._patterns.append((regex, path))
            else:
                self._static[path] = path

    def of(self, path: str) -> str:
        hit = self._static.get(path)
        if hit is not None:
            return hit
        for regex, template in self._patterns:
            if regex.match(path):
                return template
        return UNMATCHED


def method_label(method: str) -> str:
    return method if method in METHODS else "other"


_default: RouteTemplates | None = None
_default_lock = threading.Lock()


def default_templates() -> RouteTemplates:
    """The templates of turbospark's own route table (the same for every
    server in the process), built on first use."""
    # (read when first needed: the route table is a layer above the sinks,
    # and its events route feeds on them)
    from ..routes.table import route_table

    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = RouteTemplates(route_table())
    return _default
