"""Arrays and objects of the JSON Schema converter (a mixin of
``schema._Converter``): items, prefixItems, properties, required, and the
counts on them."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .errors import UnsupportedSchema, _Empty
from .rules import _lit, _Rules, _seq


class _Containers:
    """Array and object rules; needs the converter's ``r``, ``inside``,
    ``any_object`` and ``plain_string``."""

    r: _Rules

    if TYPE_CHECKING:  # provided by the converter (schema._Converter)

        def inside(self, s: Any, path: str, hint: str) -> str: ...
        def any_object(self) -> str: ...
        def plain_string(self, lo: int, hi: int | None, hint: str, enc: Any = ...) -> str: ...

    # -- arrays
    def array(self, s: dict[str, Any], path: str, hint: str) -> str:
        ws = self.r.builtin("ws")
        items = s.get("items")
        if isinstance(items, list):  # draft 4-2019 tuples
            prefix, extra = items, s.get("additionalItems", True)
        else:
            prefix, extra = s.get("prefixItems", []), True if items is None else items
        lo, hi = int(s.get("minItems", 0)), s.get("maxItems")
        hi = None if hi is None else int(hi)
        if extra is False:
            hi = len(prefix) if hi is None else min(hi, len(prefix))
        if s.get("uniqueItems") is True and (hi is None or hi > 1):
            raise UnsupportedSchema("uniqueItems", path)
        if hi is not None and lo > hi:
            raise _Empty("minItems above maxItems (or more items than the schema allows)", path)
        extra_rule = None
        if extra is not False and (hi is None or hi > len(prefix)):
            try:
                extra_rule = self.inside(extra, f"{path}/items", f"{hint}-item")
            except _Empty:
                if lo > len(prefix):
                    raise
                hi = len(prefix)
        prefix_rules = []
        for i, p in enumerate(prefix[: hi if hi is not None else len(prefix)]):
            try:
                prefix_rules.append(self.inside(p, f"{path}/prefixItems/{i}", f"{hint}-{i}"))
            except _Empty:
                if i < lo:
                    raise
                break
        if len(prefix_rules) < len(prefix):  # an impossible or capped prefix item ends the array there
            hi = len(prefix_rules) if hi is None else min(hi, len(prefix_rules))
            extra_rule = None

        def rest(i: int) -> str:
            """Items from position i on (each preceded by a comma when i > 0)."""
            if hi is not None and i >= hi:
                return ""
            sep = f'"," {ws}' if i > 0 else ""
            if i >= len(prefix_rules):
                if extra_rule is None:
                    return ""
                n_lo, n_hi = max(lo - i, 0), None if hi is None else hi - i
                if i == 0:
                    return self.sep_list(f"{extra_rule} {ws}", n_lo, n_hi)
                return self.r.rep(f'"," {ws} {extra_rule} {ws}', n_lo, n_hi, f"{hint}-more")
            node = _seq(sep, prefix_rules[i], ws, rest(i + 1))
            return node if i < lo else f"({node})?"

        return self.r.add(hint, _seq(f'"[" {ws}', rest(0), '"]"'))

    def sep_list(self, item: str, lo: int, hi: int | None) -> str:
        """lo..hi comma-separated ``item`` s (item includes its trailing ws)."""
        ws = self.r.builtin("ws")
        if hi == 0:
            return ""
        more = self.r.rep(f'"," {ws} {item}', max(lo - 1, 0), None if hi is None else hi - 1, "more")
        one = _seq(item, more)
        return one if lo > 0 else f"({one})?"

    # -- objects
    def object(self, s: dict[str, Any], path: str, hint: str) -> str:
        ws = self.r.builtin("ws")
        props = s.get("properties")
        required = list(s.get("required", ()))
        ap = s.get("additionalProperties", True)
        if props is None and not required:
            return self.map(s, ap, path, hint)
        props = dict(props or {})
        for name in required:
            if name not in props:
                if ap is False:
                    raise _Empty(f"required property {name!r} forbidden by additionalProperties", path)
                props[name] = ap
        n_min, n_max = s.get("minProperties"), s.get("maxProperties")
        if n_min is not None and n_min > len(required):
            raise UnsupportedSchema("minProperties above the number of required properties", path)
        members: list[tuple[str, bool]] = []
        for name, ps in props.items():
            req = name in required
            try:
                v = self.inside(ps, f"{path}/properties/{name}", f"{hint}-{name}")
            except _Empty:
                if req:
                    raise
                continue  # a property no value satisfies is simply never written
            key = _lit(json.dumps(name, ensure_ascii=False))
            members.append((self.r.add(f"{hint}-{name}-kv", f'{key} {ws} ":" {ws} {v} {ws}'), req))
        if n_max is not None and n_max < len(members):
            if n_max < len(required):
                raise _Empty("maxProperties below the number of required properties", path)
            raise UnsupportedSchema("maxProperties below the number of properties", path)
        return self.r.add(hint, _seq(f'"{{" {ws}', self.members(members), '"}"'))

    def members(self, members: list[tuple[str, bool]]) -> str:
        """Members in order, required ones always, with commas between those written."""
        ws = self.r.builtin("ws")
        n = len(members)
        if not n:
            return ""
        after = [""] * (n + 1)  # members i.. when one was already written
        for i in reversed(range(n)):
            kv, req = members[i]
            item = f'"," {ws} {kv}'
            after[i] = _seq(item if req else f"({item})?", after[i + 1])
            if 0 < i < n - 1:  # named, so the text stays linear in the number of members
                after[i] = self.r.add(f"{kv}-rest", after[i])
        first: str | None = None  # members i.. when none was written yet (non-empty)
        for i in reversed(range(n)):
            kv, req = members[i]
            head = _seq(kv, after[i + 1])
            first = head if req or first is None else f"({head} | {first})"
        assert first is not None
        any_required = any(req for _, req in members)
        return first if any_required else f"({first})?"

    def map(self, s: dict[str, Any], ap: Any, path: str, hint: str) -> str:
        ws = self.r.builtin("ws")
        lo, hi = int(s.get("minProperties", 0)), s.get("maxProperties")
        if lo > 1:
            raise UnsupportedSchema("minProperties above 1 on an object without properties", path)
        if ap is True and lo == 0 and hi is None:
            return self.any_object()
        if ap is False:
            if lo > 0:
                raise _Empty("minProperties on an object that allows no property", path)
            return self.r.add(hint, f'"{{" {ws} "}}"')
        try:
            v = self.inside(ap, f"{path}/additionalProperties", f"{hint}-value")
        except _Empty:
            if lo > 0:
                raise
            return self.r.add(hint, f'"{{" {ws} "}}"')
        key = self.plain_string(0, None, "key")
        kv = self.r.add(f"{hint}-kv", f'{key} {ws} ":" {ws} {v} {ws}')
        return self.r.add(hint, _seq(f'"{{" {ws}', self.sep_list(kv, lo, None if hi is None else int(hi)), '"}"'))
