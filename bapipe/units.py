"""How numbers are printed for people: IEC binary units for bytes (KiB, MiB, GiB: powers of
1024, the way memories are sized) and engineering notation with SI prefixes for everything
else (s, Hz, samples/s, FLOP/s, MAC). One module, so every command prints the same way."""
from __future__ import annotations

import math

_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (1e-3, "m"), (1e-6, "u"),
       (1e-9, "n"), (1e-12, "p"))


def nbytes(n: float | None, digits: int = 3) -> str:
    """Bytes in IEC units: 97225728 -> '92.7 MiB', 68719476736 -> '64 GiB', 512 -> '512 B'."""
    if n is None:
        return "-"
    n = float(n)
    for unit in _BINARY:
        if abs(n) < 1024 or unit == _BINARY[-1]:
            return f"{n:.0f} B" if unit == "B" else f"{_sig(n, digits)} {unit}"
        n /= 1024
    return str(n)


def si(x: float | None, unit: str = "", digits: int = 3) -> str:
    """Engineering notation with an SI prefix: si(3.14038e-05, 's') -> '31.4 us',
    si(2.5e8, 'Hz') -> '250 MHz', si(1.019e6, 'samples/s') -> '1.02M samples/s' (a word unit
    keeps the prefix on the number). Seconds never take k/M/G (1500 s, not 1.5 ks)."""
    if x is None:
        return "-"
    x = float(x)
    if not math.isfinite(x):
        return f"{x} {unit}".strip()
    word = unit[:1].islower() and len(unit.split("/")[0]) > 3   # samples/s, cycles: not a symbol
    scale = [(d, p) for d, p in _SI if not (unit == "s" and d > 1)]
    div, p = scale[-1]
    if x != 0:
        for d, q in scale:
            if abs(x) >= d * (1 - 0.5 * 10 ** -digits):   # 999.96 rounds to 1.00k, not 1000
                div, p = d, q
                break
    else:
        div, p = 1.0, ""
    v = _sig(x / div, digits)
    if not unit:
        return f"{v}{p}"
    return f"{v}{p} {unit}" if word else f"{v} {p}{unit}"


def seconds(x: float | None, digits: int = 3) -> str:
    """A time: seconds(3.14038e-05) -> '31.4 us', seconds(0.386547557) -> '387 ms'."""
    return si(x, "s", digits)


def _sig(v: float, digits: int) -> str:
    """``digits`` significant digits, no exponent, no trailing zeros: 92.72 -> '92.7', 64.0 -> '64'."""
    if v == 0:
        return "0"
    d = max(0, digits - 1 - int(math.floor(math.log10(abs(v)))))
    text = f"{v:.{d}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and its noun, singular for one ("1 micro-batch", "8 micro-batches")."""
    return f"{n} {noun if n == 1 else (plural or noun + ('es' if noun.endswith('ch') else 's'))}"
