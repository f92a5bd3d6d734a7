"""Integer and decimal ranges as GBNF alternatives: ``minimum``/``maximum``
(exclusive or not) enforced exactly, on numbers written plainly (no exponent,
at most ``MAX_INT_DIGITS`` integer and ``MAX_FRACTION_DIGITS`` fraction digits)."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

from .rules import MAX_FRACTION_DIGITS, MAX_INT_DIGITS, _alt, _cls, _lit, _normalize, _rep, _seq


def _bound(s: dict[str, Any], plain: str, excl: str, lower: bool) -> tuple[float | None, bool]:
    """The tighter of ``minimum``/``exclusiveMinimum`` (both drafts' spellings)."""
    best: tuple[float | None, bool] = (None, False)
    cands = []
    if plain in s:
        cands.append((s[plain], s.get(excl) is True))
    if excl in s and not isinstance(s[excl], bool):
        cands.append((s[excl], True))
    for v, ex in cands:
        b = best[0]
        if b is None or (v > b if lower else v < b) or (v == b and ex):
            best = (v, ex)
    return best


# ---------------------------------------------------------------- integers
def _same_len_range(a: str, b: str) -> list[str]:
    """Alternatives for digit strings of one length between a and b."""
    if a == b:
        return [_lit(a)]
    i = 0
    while a[i] == b[i]:
        i += 1
    pre = _lit(a[:i]) if i else ""
    a, b = a[i:], b[i:]
    rest = len(a) - 1
    dcls: Callable[[str | int, str | int], str] = lambda x, y: f'"{x}"' if x == y else f"[{x}-{y}]"  # noqa: E731
    if rest == 0:
        return [_seq(pre, dcls(a[0], b[0]))]
    out: list[str] = []
    lo, hi = int(a[0]), int(b[0])
    if a[1:] != "0" * rest:
        out += [_seq(pre, f'"{a[0]}"', x) for x in _same_len_range(a[1:], "9" * rest)]
        lo += 1
    high: list[str] = []
    if b[1:] != "9" * rest:
        high = [_seq(pre, f'"{b[0]}"', x) for x in _same_len_range("0" * rest, b[1:])]
        hi -= 1
    if lo <= hi:
        out.append(_seq(pre, dcls(lo, hi), _rep("[0-9]", rest, rest)))
    return out + high


def _natural_range(lo: int, hi: int | None) -> list[str]:
    """Alternatives for naturals in [lo, hi] without leading zeros (hi None: up to MAX_INT_DIGITS digits)."""
    n_lo = len(str(lo))
    if hi is None:
        alts = _same_len_range(str(lo), "9" * n_lo)
        if n_lo < MAX_INT_DIGITS:
            alts.append(f"[1-9] {_rep('[0-9]', n_lo, MAX_INT_DIGITS - 1)}")
        return alts
    alts = []
    for n in range(n_lo, len(str(hi)) + 1):
        a, b = max(lo, 10 ** (n - 1) if n > 1 else 0), min(hi, 10**n - 1)
        if a <= b:
            alts += _same_len_range(str(a), str(b))
    return alts


_BIG = 10**MAX_INT_DIGITS - 1


def _int_range(lo: int | None, hi: int | None) -> list[str]:
    """Alternatives for integers in [lo, hi] (None: unbounded on that side)."""
    lo = None if lo is not None and lo < -_BIG else lo
    hi = None if hi is not None and hi > _BIG else hi
    if lo is not None and hi is not None and lo > hi:
        return []
    alts = []
    if lo is None or lo < 0:
        m_lo = max(1, -hi) if hi is not None else 1
        m_hi = -lo if lo is not None else None
        if m_hi is None or m_lo <= m_hi:
            alts.append(_seq('"-"', _alt(_natural_range(m_lo, m_hi))))
    if hi is None or hi >= 0:
        alts += _natural_range(max(lo, 0) if lo is not None else 0, hi)
    return alts


def _decimal(v: float | int) -> Decimal:
    return Decimal(v) if isinstance(v, int) else Decimal(repr(float(v)))


def _split(d: Decimal) -> tuple[int, str]:
    """|d| as (integer part, fraction digits without trailing zeros)."""
    i, _, f = format(abs(d), "f").partition(".")
    return int(i), f.rstrip("0")


def _frac(
    lo: str | None, hi: str | None, lo_incl: bool, hi_incl: bool, budget: int, nonempty: bool = False
) -> list[str]:
    """Alternatives for fraction digit strings f (no trailing zero, at most ``budget`` digits,
    empty meaning .0) with lo <= 0.f <= hi; None: that side is free (>= 0, < 1).

    Digit strings compare like numbers once padded with zeros, so this walks
    the bounds digit by digit.
    """
    alts = []
    if not nonempty and (lo is None or (lo == "" and lo_incl)) and (hi is None or hi != "" or hi_incl):
        alts.append('""')
    if budget == 0 or hi == "":
        return alts
    lo_free, hi_free = lo is None or lo == "", hi is None
    l0 = 0 if lo_free else int(lo[0])  # type: ignore[index]
    u0 = 9 if hi_free else int(hi[0])  # type: ignore[index]
    free = [d for d in range(10) if (lo_free or d > l0) and (hi_free or d < u0)]
    any_rest = _seq(_rep("[0-9]", 0, budget - 2), "[1-9]") if budget >= 2 else None
    if nz := [d for d in free if d]:
        cls = f'"{nz[0]}"' if len(nz) == 1 else _cls(_normalize([(48 + d, 48 + d) for d in nz]))
        alts.append(_seq(cls, f"({any_rest})?" if any_rest else ""))
    if 0 in free and any_rest:
        alts.append(_seq('"0"', f"({any_rest})"))
    for d in sorted({d for d in (None if lo_free else l0, None if hi_free else u0) if d is not None}):
        if d in free or (not lo_free and d < l0) or (not hi_free and d > u0):
            continue
        sub_lo = lo[1:] if not lo_free and d == l0 else None  # type: ignore[index]
        sub_hi = hi[1:] if not hi_free and d == u0 else None  # type: ignore[index]
        rest = _frac(sub_lo, sub_hi, lo_incl, hi_incl, budget - 1, nonempty=d == 0)
        if rest:
            alts.append(_seq(f'"{d}"', _alt(rest)))
    return alts


def _with_point(fracs: list[str]) -> str:
    """Fraction alternatives (``""`` for none) as the text after the integer part."""
    nonempty = [f for f in fracs if f != '""']
    if not nonempty:
        return '""'
    body = _seq('"."', _alt(nonempty))
    return f"({body})?" if '""' in fracs else body


def _magnitude_range(lo: Decimal | None, lo_incl: bool, hi: Decimal | None, hi_incl: bool, budget: int) -> list[str]:
    """Alternatives for decimals y >= 0 written plainly with lo <= y <= hi (None: unbounded)."""
    li, lf = _split(lo) if lo is not None else (0, "")
    if lo is None:
        lo_incl = True
    if hi is None:
        alts = [_seq(_lit(str(li)), _with_point(_frac(lf, None, lo_incl, True, budget)))]
        if li < _BIG:
            mid = _natural_range(li + 1, None)
            alts.append(_seq(_alt(mid), _with_point(_frac(None, None, True, True, budget))))
        return alts
    hi_i, hf = _split(hi)
    if li > hi_i:
        return []
    if li == hi_i:
        fr = _frac(lf, hf, lo_incl, hi_incl, budget)
        return [_seq(_lit(str(li)), _with_point(fr))] if fr else []
    alts = []
    fr = _frac(lf, None, lo_incl, True, budget)
    if fr:
        alts.append(_seq(_lit(str(li)), _with_point(fr)))
    if li + 1 <= hi_i - 1:
        alts.append(_seq(_alt(_natural_range(li + 1, hi_i - 1)), _with_point(_frac(None, None, True, True, budget))))
    fr = _frac(None, hf, True, hi_incl, budget)
    if fr:
        alts.append(_seq(_lit(str(hi_i)), _with_point(fr)))
    return alts


def _number_range(lo: Any, lo_incl: bool, hi: Any, hi_incl: bool) -> list[str]:
    """Alternatives for plain decimals (no exponent) between lo and hi, exactly.

    Fractions get at most 15 significant digits in all near a bound, so two
    distinct written decimals never parse to the same double (an exclusive
    bound stays exclusive after parsing).
    """
    dlo = None if lo is None else _decimal(lo)
    dhi = None if hi is None else _decimal(hi)
    if dlo is not None and dlo < -_BIG:
        dlo = None
    if dhi is not None and dhi > _BIG:
        dhi = None
    int_digits = [len(str(_split(d)[0])) for d in (dlo, dhi) if d is not None]
    budget = max(1, MAX_FRACTION_DIGITS - max(int_digits, default=0))
    alts = []
    # x >= 0
    if dhi is None or dhi > 0 or (dhi == 0 and hi_incl):
        if dlo is None or dlo < 0:
            alts += _magnitude_range(Decimal(0), True, dhi, hi_incl, budget)
        else:
            alts += _magnitude_range(dlo, lo_incl, dhi, hi_incl, budget)
    # x = -y < 0, y in [-hi, -lo], y > 0
    if dlo is None or dlo < 0:
        if dhi is None or dhi >= 0:
            y_lo, y_lo_incl = Decimal(0), False
        else:
            y_lo, y_lo_incl = -dhi, hi_incl
        neg = _magnitude_range(y_lo, y_lo_incl, None if dlo is None else -dlo, lo_incl, budget)
        if neg:
            alts.append(_seq('"-"', _alt(neg)))
    return alts
