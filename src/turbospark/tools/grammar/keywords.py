"""What JSON Schema keywords mean here (enforced, rejected or annotations) and
the JSON value semantics validators use (types, equality)."""

from __future__ import annotations

from typing import Any

# ---------------------------------------------------------------- keywords
#: Assertions we do not enforce: their presence rejects the schema.
UNSUPPORTED = {
    "not": "not",
    "if": "if/then/else",
    "patternProperties": "patternProperties",
    "propertyNames": "propertyNames",
    "dependencies": "dependencies",
    "dependentRequired": "dependentRequired",
    "dependentSchemas": "dependentSchemas",
    "unevaluatedProperties": "unevaluatedProperties",
    "unevaluatedItems": "unevaluatedItems",
    "contains": "contains",
    "minContains": "contains",
    "maxContains": "contains",
    "$dynamicRef": "$dynamicRef",
    "$recursiveRef": "$recursiveRef",
}
#: Assertions we enforce. Every other keyword is an annotation (ignored, as validators do).
HANDLED = {
    "type",
    "enum",
    "const",
    "$ref",
    "allOf",
    "anyOf",
    "oneOf",
    "properties",
    "required",
    "additionalProperties",
    "minProperties",
    "maxProperties",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
}
ASSERTING = HANDLED | set(UNSUPPORTED)
JSON_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
#: Keywords that imply a type when "type" is absent (we then write that type).
_IMPLIES = {
    "object": ("properties", "required", "additionalProperties", "minProperties", "maxProperties"),
    "array": ("items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"),
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
}
_OBJECT_SHAPE = ("properties", "additionalProperties")


# ---------------------------------------------------------------- values
def _type_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _json_eq(a: Any, b: Any) -> bool:
    """JSON Schema equality: 1 == 1.0, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_eq(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_eq(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _overlap(ta: set[str], tb: set[str]) -> set[str]:
    out = set()
    for x in ta:
        for y in tb:
            if x == y or {x, y} == {"integer", "number"}:
                out.add("integer" if "integer" in (x, y) else x)
    return out
