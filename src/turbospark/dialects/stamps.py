"""Known per-session client stamps, taken out of prompts so they do not end
prefix reuse (``--normalize-client-stamps``, on by default).

Claude Code puts an attribution line at the top of its system prompt,
``x-anthropic-billing-header: cc_version=2.1.197.0df; cc_entrypoint=cli;
cch=a5145;``, whose version suffix and ``cch`` hash change between sessions
(and, in older releases, between requests). It is billing metadata for
Anthropic's API and says nothing to a model, but as the first tokens of the
prompt it makes every new session or subagent miss a cached prefix after a
few tokens. The line is removed from system messages (the only place it is
sent); each removal is counted in the request's ``requestRouted``.
"""

from __future__ import annotations

import re
from typing import Any

#: one attribution line, with its line break
CLAUDE_CODE_ATTRIBUTION = re.compile(r"^[ \t]*x-anthropic-billing-header:[^\n]*(?:\n|$)", re.MULTILINE)


def strip_stamps(text: str) -> tuple[str, int]:
    """``text`` without the stamps, and how many there were."""
    if "x-anthropic-billing-header:" not in text:
        return text, 0
    return CLAUDE_CODE_ATTRIBUTION.subn("", text)


def normalize_messages(messages: list[dict[str, Any]]) -> int:
    """Remove the stamps from the system messages in place; returns how many
    were removed."""
    removed = 0
    for m in messages:
        if m.get("role") == "system" and isinstance(m.get("content"), str):
            m["content"], n = strip_stamps(m["content"])
            removed += n
    return removed
