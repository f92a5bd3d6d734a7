"""What the console shows of strings a client chose (a path, a model name,
an error quoting the request): plain text, never Rich/Textual markup, and
with no control characters, which would reach the operator's terminal as
escape sequences (a clipboard write, a title change, a cleared screen) or
reorder what it shows (bidirectional overrides)."""

from __future__ import annotations

from rich.text import Text

#: C0 and C1 controls, DEL, the bidirectional marks, embeddings, overrides and
#: isolates, the line and paragraph separators, and the byte order mark
_UNSAFE = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))},
    **{
        c: f"\\u{c:04x}"
        for c in (0x061C, 0x200E, 0x200F, 0x2028, 0x2029, 0xFEFF, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
    },
}


def printable(value: object) -> str:
    """``value`` as text with every control character written out (``\\x1b``)."""
    return str(value).translate(_UNSAFE)


def plain(value: object, style: str = "") -> Text:
    """A table cell or label: :func:`printable`, never parsed as markup."""
    return Text(printable(value), style=style)
