"""$ref resolution and allOf merging: the part of the JSON Schema converter
that turns a schema into one flattened dict of assertions (a mixin of
``schema._Converter``)."""

from __future__ import annotations

import urllib.parse
from typing import Any

from .errors import UnsupportedSchema, _Empty
from .keywords import _OBJECT_SHAPE, ASSERTING, _json_eq, _overlap


class _Flattener:
    """Resolves local $refs against ``root`` and merges allOf; needs ``root``."""

    root: Any

    # -- $ref, allOf
    def _check_id(self, s: dict[str, Any], path: str) -> None:
        if "$id" in s and s is not self.root:
            raise UnsupportedSchema("$id inside a schema (changes $ref resolution)", path)

    def resolve(self, ref: Any, path: str) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            what = "$ref to a remote URL" if isinstance(ref, str) and "://" in ref else "$ref to another document"
            raise UnsupportedSchema(what, path)
        frag = ref[1:]
        if frag == "":
            return self.root
        if not frag.startswith("/"):
            raise UnsupportedSchema("$ref to an $anchor", path)
        node = self.root
        for part in frag[1:].split("/"):
            part = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise UnsupportedSchema(f"$ref {ref} that points nowhere", path)
        return node

    def flatten(self, s: Any, path: str, stack: tuple[str, ...]) -> dict[str, Any]:
        """``s`` with top-level $ref and allOf merged in, annotations dropped."""
        if s is True:
            return {}
        if s is False:
            raise _Empty("false schema (no value is valid)", path)
        if not isinstance(s, dict):
            raise UnsupportedSchema(f"a schema must be an object, not {type(s).__name__}", path)
        self._check_id(s, path)
        out = {k: v for k, v in s.items() if k in ASSERTING and k not in ("$ref", "allOf")}
        if "$ref" in s:
            ref = s["$ref"]
            if ref in stack:
                raise UnsupportedSchema("circular $ref", path)
            out = self.merge(out, self.flatten(self.resolve(ref, path), ref, (*stack, ref)), path)
        for i, part in enumerate(s.get("allOf", ())):
            out = self.merge(out, self.flatten(part, f"{path}/allOf/{i}", stack), path)
        return out

    def merge(self, a: dict[str, Any], b: dict[str, Any], path: str) -> dict[str, Any]:
        """The conjunction of two flattened schemas, where it is a schema we can write down."""
        out = dict(a)
        for k, v in b.items():
            if k not in out:
                out[k] = v
                continue
            u = out[k]
            if k in _OBJECT_SHAPE or _json_eq(u, v):
                continue
            if k == "type":
                ta = [u] if isinstance(u, str) else list(u)
                tb = [v] if isinstance(v, str) else list(v)
                both = list(dict.fromkeys(t for x in ta for y in tb for t in _overlap({x}, {y})))
                if not both:
                    raise _Empty(f"allOf with incompatible types {u!r} and {v!r}", path)
                out[k] = both
            elif k == "required":
                out[k] = list(dict.fromkeys([*u, *v]))
            elif k in ("minimum", "minLength", "minItems", "minProperties") or (
                k == "exclusiveMinimum" and not isinstance(u, bool) and not isinstance(v, bool)
            ):
                out[k] = max(u, v)
            elif k in ("maximum", "maxLength", "maxItems", "maxProperties") or (
                k == "exclusiveMaximum" and not isinstance(u, bool) and not isinstance(v, bool)
            ):
                out[k] = min(u, v)
            elif k == "enum":
                out[k] = [x for x in u if any(_json_eq(x, y) for y in v)]
            elif k == "const":
                raise _Empty("allOf with two different const values", path)
            elif (
                k == "items"
                and isinstance(u, (dict, bool))
                and isinstance(v, (dict, bool))
                and not ({"prefixItems", "additionalItems"} & (a.keys() | b.keys()))
            ):
                out[k] = {"allOf": [u, v]}
            else:
                raise UnsupportedSchema(f"allOf combining two different {k!r}", path)
        if any(k in a for k in _OBJECT_SHAPE) and any(k in b for k in _OBJECT_SHAPE):
            out.pop("properties", None)
            out.pop("additionalProperties", None)
            out.update(self._merge_objects(a, b))
        return out

    @staticmethod
    def _merge_objects(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        pa, pb = a.get("properties", {}), b.get("properties", {})
        apa, apb = a.get("additionalProperties", True), b.get("additionalProperties", True)
        props: dict[str, Any] = {}
        for name in [*pa, *(n for n in pb if n not in pa)]:
            parts = []
            for p, ap in ((pa, apa), (pb, apb)):
                if name in p:
                    parts.append(p[name])
                elif ap is not True:
                    parts.append(ap)
            if any(x is False for x in parts):
                props[name] = False
            else:
                parts = [x for x in parts if x is not True]
                props[name] = True if not parts else parts[0] if len(parts) == 1 else {"allOf": parts}
        out: dict[str, Any] = {}
        if "properties" in a or "properties" in b:
            out["properties"] = props
        if apa is True or apb is True:
            ap = apb if apa is True else apa
        elif apa is False or apb is False:
            ap = False
        else:
            ap = {"allOf": [apa, apb]}
        if ap is not True:
            out["additionalProperties"] = ap
        return out
