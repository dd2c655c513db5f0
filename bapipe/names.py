"""Legal C++/Verilog identifiers from layer names, and the way back.

Imported models keep their exporters' names (``/features/features.0/Conv``,
``encoder.layer.0::attn``), which are not identifiers and would make paths if used as file
names. Generated code names modules, files, streams and arrays after layers through
``legal``; reports keep the original names, and ``name_map`` gives the way back from a
generated identifier to its layer.

``legal`` is a pure function of one name, so every place that forms an identifier gets the
same answer without passing a table around. Names that already are identifiers (every zoo
and YAML name) are returned unchanged; any other name becomes its readable part plus a
short hash of the whole name, which keeps two names apart that differ only in punctuation
(``a.b`` and ``a/b``). Identifiers are bounded (``MAX_IDENT``): a 10,000-character
name, legal or not, becomes its first ``MAX_BASE`` characters plus the hash, so file names
and tool symbols built from it stay short.

Names are data, never code: where generated text shows an original name (a comment, a
string, a report line in C++, Verilog, TCL, a Makefile or a .cfg), it goes through ``shown``,
which keeps a bounded run of characters that mean nothing in any of those languages
(letters, digits and ``_ . : / + = @ -``; no quote, backslash, ``*``, ``#``, ``%``, ``$``,
brace, bracket, newline or non-ASCII character) and marks any change with the hash of the
whole name. ``legal`` and ``shown`` are the one way a user-provided name reaches generated
text (tests/test_names_injection.py feeds hostile names through ``gen`` and compiles the
result).
"""
from __future__ import annotations

import hashlib
import re

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

#: words an identifier must not be in C++ or (System)Verilog (case-sensitive languages;
#: the checks compare exact spelling)
RESERVED = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class
compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype
default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline
int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public register
reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch template
this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t
while xor xor_eq
always always_comb always_ff always_latch assign automatic begin buf bufif0 bufif1 case casex casez cell cmos
config deassign defparam design disable edge end endcase endconfig endfunction endgenerate endmodule
endprimitive endspecify endtable endtask event force forever fork function generate genvar highz0 highz1
ifnone incdir include initial inout input instance integer join large liblist library localparam logic
macromodule medium module nand negedge nmos nor noshowcancelled notif0 notif1 output parameter pmos posedge
primitive pull0 pull1 pulldown pullup pulsestyle_ondetect pulsestyle_onevent rcmos real realtime reg release
repeat rnmos rpmos rtran rtranif0 rtranif1 scalared showcancelled small specify specparam strong0 strong1
supply0 supply1 table task time tran tranif0 tranif1 tri tri0 tri1 triand trior trireg uwire vectored wait
wand weak0 weak1 wire wor xnor
""".split())

#: longest readable part kept before the hash (tools print module names; keep them short)
MAX_BASE = 48
#: longest identifier ``legal`` returns (a longer legal name is shortened like an illegal one)
MAX_IDENT = 64
#: longest readable part ``shown`` keeps
MAX_SHOWN = 64
_SHOWN_OK = re.compile(r"[A-Za-z0-9_.:/+=@ -]")


def is_legal(name: str) -> bool:
    """True when ``name`` is usable as is in C++ and Verilog (and as a file name)."""
    return (bool(_IDENT.match(name)) and name not in RESERVED and not name.startswith("__")
            and len(name) <= MAX_IDENT)


def is_board_name(name: str) -> bool:
    """A cluster's board name: an identifier of at most ``MAX_IDENT`` characters. Generated
    code always adds a prefix or suffix to it (``<board>_top``, ``u_<board>``,
    ``link/<board>.cfg``), so a keyword such as ``small`` is fine; anything else (a quote,
    a newline, a ``/``) is refused where the cluster is read."""
    return bool(_IDENT.match(name)) and len(name) <= MAX_IDENT and not name.startswith("__")


def legal(name: str) -> str:
    """A legal C++/Verilog identifier for ``name``: itself when it already is one, else its
    letters, digits and underscores (runs of anything else become one ``_``) plus an 8-digit
    hash of the original, so that distinct names stay distinct."""
    if is_legal(name):
        return name
    base = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")[:MAX_BASE].strip("_")
    if not base or base[0].isdigit():
        base = "n_" + base if base else "n"
    return f"{base}_{_hash(name)}"


def _hash(name: str) -> str:
    # surrogatepass: a YAML or ONNX string may hold a lone surrogate; it still has one hash
    return hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def shown(name) -> str:
    """``name`` as it may appear inside a comment or string literal of generated C++,
    Verilog, TCL, Makefile or .cfg text: one line of at most ``MAX_SHOWN`` + 9 characters
    that can neither end the comment or string nor start a new one (module docstring).
    Returned unchanged when it already is such text; otherwise every other character
    becomes ``_``, the text is cut to ``MAX_SHOWN`` characters and ``~`` plus the 8-digit
    hash of the whole name is appended, so two names that differ only in what was
    replaced still read apart."""
    name = str(name)
    keep = "".join(c if _SHOWN_OK.match(c) else "_" for c in name)
    keep = keep.replace("  ", "_ ")   # no runs of spaces (a name is one token to the reader)
    if keep == name and len(name) <= MAX_SHOWN and name.strip() == name and name:
        return name
    return f"{keep[:MAX_SHOWN].strip()}~{_hash(name)}"


def name_map(names) -> dict[str, str]:
    """Generated identifier -> original name for ``names`` (the way back, for reports).

    Raises ValueError if two names would share an identifier (a hash collision: in
    practice never, but a silent merge of two layers must not happen).
    """
    back: dict[str, str] = {}
    for n in names:
        k = legal(n)
        if k in back and back[k] != n:
            raise ValueError(f"layer names '{back[k]}' and '{n}' map to the same identifier '{k}'")
        back[k] = n
    return back


def original(identifier: str, names) -> str:
    """The original layer name behind a generated identifier (itself when none matches)."""
    return name_map(names).get(identifier, identifier)


def restore(text: str, identifiers: dict[str, str]) -> str:
    """``text`` (an instance path, a report cell) with every generated identifier in it
    replaced by its original layer name, e.g. ``fpga0/s0_features_0_Conv_1a2b3c4d_mvu`` ->
    ``fpga0/s0_/features/features.0/Conv_mvu``. ``identifiers``: identifier -> original (a
    build's manifest ``identifiers``). Longer identifiers go first, so one that contains
    another is restored whole; the 8-digit hash keeps a plain word from matching."""
    for ident in sorted(identifiers, key=len, reverse=True):
        if ident in text:
            text = text.replace(ident, identifiers[ident])
    return text
