"""GBNF grammars that make llama.cpp's sampler write only valid output.

Three producers share one JSON Schema converter:

- :func:`json_schema_grammar`: one JSON value valid against a schema
  (OpenAI ``response_format`` json_schema, Ollama ``format: {schema}``);
- :func:`json_object_grammar`: any JSON object (``json_object``, Ollama ``"json"``);
- :func:`tool_call_grammar`: exactly one tool call in a model family's text syntax
  (``tool_choice`` required / named, Anthropic ``any`` / ``tool``).

Why not ``llama_cpp.llama_grammar.json_schema_to_gbnf``: it silently ignores
minimum/maximum, treats oneOf as anyOf, lets strings hold raw control
characters (invalid JSON) and merges allOf loosely. Here every keyword is either
enforced or makes :func:`check_schema` raise :class:`UnsupportedSchema` naming
it. The grammar accepts a *subset* of the valid texts, chosen so that small
models finish: properties in schema order and only the declared ones, at most
one space between tokens, numbers without exponents and with at most 16 integer
and 15 fraction digits, optionally bounded strings (``bound_strings``).

Modules: ``rules`` (GBNF text and the grammar being built), ``numbers``
(integer/decimal ranges), ``pattern`` (the regex subset), ``keywords``,
``merge`` ($ref/allOf) and ``containers`` (arrays/objects) behind ``schema``
(the converter and the JSON grammars), and ``calls`` (tool-call grammars).
"""

from __future__ import annotations

from ..calls import SYNTAXES
from .calls import tool_call_grammar
from .errors import UnsupportedSchema
from .schema import DEFAULT_MAX_STRING, check_schema, json_object_grammar, json_schema_grammar

__all__ = [
    "DEFAULT_MAX_STRING",
    "SYNTAXES",
    "UnsupportedSchema",
    "check_schema",
    "json_object_grammar",
    "json_schema_grammar",
    "tool_call_grammar",
]
