"""The grammar's two errors: a schema feature it cannot enforce, and a
(sub)schema no value satisfies."""

from __future__ import annotations


class UnsupportedSchema(ValueError):
    """A schema feature the grammar cannot enforce (or a schema no value satisfies)."""

    def __init__(self, feature: str, path: str = "#") -> None:
        self.feature = feature
        self.path = path
        super().__init__(f"unsupported JSON schema feature at {path}: {feature}")


class _Empty(UnsupportedSchema):
    """No value satisfies this (sub)schema; an anyOf branch like this is dropped."""
