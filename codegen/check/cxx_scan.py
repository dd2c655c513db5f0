"""What a generated HLS kernel builds, read from its C++: storage, pipelined loops, DATAFLOW channels.

``bapipe check`` (codegen.check.physical_rules) applies vendor rules to this reading; nothing here
comes from the Design. The parser is codegen.check.cxx_memory's (preprocessing with ``__SYNTHESIS__``,
typedefs/structs/templates, expressions); this module walks the kernel's call tree from its top
function (template arguments bound, one hardware instance per call site, as DATAFLOW builds them)
and records:

- every storage declaration: static/local arrays, ``hls::stream`` FIFOs and the top function's
  m_axi / axis ports, with its element bits, dimensions, ARRAY_PARTITION / ARRAY_RESHAPE and
  BIND_STORAGE pragmas (pragmas on a parameter apply to the array it is bound to);
- every ``#pragma HLS PIPELINE`` loop: its declared II, and the reads and writes per iteration
  of every array, stream and port it touches. Loops and calls inside a pipelined loop are
  unrolled/inlined (UG1399, "pipelining a loop unrolls the loops nested in it"); the branches of
  an ``if`` or ``switch`` are exclusive, so they count as the largest branch; multipliers are the
  products of two data-typed operands (``a * b`` of a function's non-integer parameters);
- every DATAFLOW region: its processes and, per channel, which process reads or writes it.

Pure function of the rendered files (path -> text).
"""
from __future__ import annotations

import functools
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field

from bapipe.codegen.check.cxx_memory import (Program, Unknown, _scan, _tparams, eval_expr, file_text,
                                             include_order, local_constants, matching, preprocess, split_args, type_bits,
                                             _TEMPLATE)

_INT_TYPES = re.compile(r"^(?:const\s+)?(?:unsigned\s+|signed\s+)?(?:bool|char|short|int|long|long long|size_t|"
                        r"u?int\d+_t)\s*&?$")
_KEYWORDS = {"return", "else", "case", "goto", "delete", "new", "throw", "typedef", "using", "if", "for",
             "while", "do", "switch", "sizeof", "static_cast", "reinterpret_cast", "const_cast"}


@dataclass
class Decl:
    """One storage object of the kernel."""

    id: str                 # call path / name
    kind: str               # array | stream | m_axi | axis
    elem_bits: int
    dims: list[int]
    static: bool = False
    const: bool = False
    partitions: list[tuple[str, int, int]] = field(default_factory=list)   # (type, factor, dim); dim 0 = all
    reshapes: list[tuple[str, int, int]] = field(default_factory=list)
    impl: str | None = None       # BIND_STORAGE impl (lower case)
    depth: int = 0                # streams: FIFO depth
    bundle: str | None = None     # m_axi bundle
    widen_bits: int = 0           # m_axi max_widen_bitwidth

    @property
    def elements(self) -> int:
        return math.prod(self.dims) if self.dims else 1


@dataclass
class Loop:
    """One pipelined loop: declared II and the accesses of one iteration."""

    path: str
    label: str
    ii: int
    access: dict[str, list[int]]      # decl id -> [reads, writes]
    mults: list[tuple[int, int]]       # (a bits, b bits) per multiplier
    unknown_trips: list[str] = field(default_factory=list)
    iterations: int | None = None      # iterations per sample (the top's n = 1), None when not known


@dataclass
class Dataflow:
    """One DATAFLOW region: channel decl id -> [(process, 'r'|'w'|'rw')]."""

    path: str
    processes: list[str]
    channels: dict[str, list[tuple[str, str]]]


@dataclass
class KernelScan:
    kernel: str
    decls: dict[str, Decl]
    loops: list[Loop]
    dataflows: list[Dataflow]
    problems: list[str]
    takes_n: bool = False          # the top has a sample count ``n`` (its loops scale with it)
    takes_flush: bool = False      # the top has ``flush`` (a call that ends the iteration)


# --- reading the sources ---------------------------------------------------------------------


@dataclass
class Source:
    prog: Program
    macros: dict[str, tuple[list[str], str]]
    sigs: dict[str, list[tuple[str, str, list[str]]]]      # function -> [(type, name, dims)]
    methods: dict[str, dict[str, tuple[list[str], str]]]   # struct -> method -> (params, body)
    members: dict[str, list[tuple[str, int]]] = field(default_factory=dict)   # struct -> [(member, dims)]
    # what every Scanner of the kernel reads again and again, computed once (pure functions of
    # the text): a function's body with its macros expanded, a text's statements and calls
    bodies: dict[str, str] = field(default_factory=dict)
    stmts: dict[str, list] = field(default_factory=dict)
    calls: dict[str, list] = field(default_factory=dict)

    def body(self, fname: str) -> str:
        """``fname``'s body, function-like macros expanded."""
        b = self.bodies.get(fname)
        if b is None:
            b = self.bodies[fname] = expand_macros(self.prog.functions[fname][1], self.macros)
        return b

    def parsed(self, text: str) -> list:
        """:func:`parse_stmts` of ``text`` (read-only: callers never change the nodes)."""
        st = self.stmts.get(text)
        if st is None:
            st = self.stmts[text] = parse_stmts(text)
        return st


def _order(files: dict[str, str | bytes], kernel_file: str) -> list[str]:
    """The texts of ``kernel_file`` and its includes, included ones first."""
    return [file_text(files, p) for p in include_order(files, kernel_file)]


def read_source(files: dict[str, str | bytes], kernel_file: str) -> Source:
    """Parse ``kernel_file`` and what it includes (as codegen.check.cxx_memory.kernel_memory)."""
    prog, macros, pre = Program(), {}, []
    for raw in _order(files, kernel_file):
        text = preprocess(raw, prog.defines, macros)
        pre.append(text)
        _scan(text, prog)
    sigs, methods, members = {}, {}, {}
    for text in pre:
        _signatures(text, prog, sigs)
        _methods(text, prog, methods, members)
    return Source(prog, macros, sigs, methods, members)


def _param(p: str) -> tuple[str, str, list[str]]:
    p = p.split("=")[0].strip()
    dims = re.findall(r"\[([^\]]*)\]", p)
    p = re.sub(r"\[[^\]]*\]", "", p).strip()
    m = re.match(r"(.*?)([A-Za-z_]\w*)\s*$", p, re.S)
    if not m:
        return (p, "", dims)
    typ = m.group(1).strip()
    if typ.endswith("*"):
        typ, dims = typ[:-1].strip(), dims or ["?"]
    return (typ.rstrip("&").strip(), m.group(2), dims)


#: a (qualified) name, maybe with template arguments: a call's start (codegen.check.cxx_memory's _CALL)
_CALL = re.compile(r"(?<![\w.>])((?:\w+::)*)(\w+)\s*(<)?")
_CALL_AT = re.compile(r"((?:\w+::)*)(\w+)\s*(<)?")
#: a name (with at most one ``ns::`` qualifier) followed by ``(``, not a member or a suffix:
#: every place a function of the program may be defined or called
_NAMED_PAREN = re.compile(r"(?<![\w.:>])(?:\w+::)?(\w+)\s*\(")


def _signatures(text: str, prog: Program, out: dict) -> None:
    """Parameters of every function definition; overloads (a second definition of a name, e.g.
    the array and the stream ``mvu``) are added to ``prog.functions`` as ``name@k``.
    The text is scanned once (the places each name is followed by ``(``), then the names are
    taken in the program's order, each at its places in text order."""
    places: dict[str, list] = defaultdict(list)
    for m in _NAMED_PAREN.finditer(text):
        places[m.group(1)].append(m)
    for name in [f for f in prog.functions if "@" not in f]:
        for m in places.get(name, ()):
            po = m.end() - 1
            try:
                pc = matching(text, po, "(", ")")
            except Unknown:
                continue
            k = pc + 1
            while k < len(text) and text[k] in " \t\n":
                k += 1
            if text.startswith("const", k):
                k = _skip_ws(text, k + 5)
            if text[k:k + 1] != "{":
                continue
            params = [_param(p) for p in split_args(text[po + 1:pc])]
            head = text[max(0, max(text.rfind(";", 0, m.start()), text.rfind("}", 0, m.start()))):m.start()]
            tm = _TEMPLATE.search(head)
            tparams = _tparams(head[head.index("<", tm.start()) + 1:head.rindex(">")]) if tm else []
            if tm and ">" in head[tm.end():]:
                gt = matching(head, head.index("<", tm.start()), "<", ">")
                tparams = _tparams(head[head.index("<", tm.start()) + 1:gt])
            key = name
            while key in out and out[key] != params:
                key = f"{name}@{len([x for x in out if x.split('@')[0] == name])}"
            if key in out:
                continue
            out[key] = params
            if key != name:
                close = matching(text, k, "{", "}")
                prog.functions[key] = (tparams, text[k + 1:close])


def _methods(text: str, prog: Program, out: dict, members: dict) -> None:
    for m in re.finditer(r"struct\s+(\w+)\s*\{", text):
        close = matching(text, m.end() - 1, "{", "}")
        body = text[m.end():close]
        ms, flat, k = {}, "", 0
        for fm in re.finditer(r"[\w:<>*&]+\s+(\w+)\s*\(([^)]*)\)\s*(?:const\s*)?\{", body):
            if fm.start() < k:
                continue
            bo = fm.end() - 1
            bc = matching(body, bo, "{", "}")
            ms[fm.group(1)] = ([_param(p)[1] for p in split_args(fm.group(2))], body[bo + 1:bc])
            flat += body[k:fm.start()] + ";"
            k = bc + 1
        flat += body[k:]
        mem = []
        for piece in flat.split(";"):
            piece = piece.strip()
            pm = re.search(r"\(\s*\*\s*(\w+)\s*\)\s*((?:\[[^\]]*\])*)$", piece)
            if pm:   # T (*name)[A][B]: a pointer to rows
                mem.append((pm.group(1), 1 + len(re.findall(r"\[", pm.group(2)))))
                continue
            if not piece or "(" in piece:
                continue
            typ, name, dims = _param(piece)
            if name:
                mem.append((name, len(dims)))
        out[m.group(1)] = ms
        members[m.group(1)] = mem


def expand_macros(text: str, macros: dict) -> str:
    """Expand function-like macros (one level deep, enough for the generated headers)."""
    for name, (params, body) in macros.items():
        for _ in range(50):
            m = re.search(rf"\b{re.escape(name)}\s*\(", text)
            if not m:
                break
            pc = matching(text, m.end() - 1, "(", ")")
            args = split_args(text[m.end():pc])
            rep = body
            if params == ["..."]:
                rep = rep.replace("__VA_ARGS__", ", ".join(args))
            else:
                for p, a in zip(params, args):
                    rep = re.sub(rf"(?<!#)\b{re.escape(p)}\b", a, rep)
            text = text[:m.start()] + rep + text[pc + 1:]
    return text


# --- statements ------------------------------------------------------------------------------


def parse_stmts(text: str) -> list[tuple]:
    """Statements of a function body: ('pragma', t) ('for', header, body, label) ('if', cond,
    then, else) ('switch', expr, [case bodies]) ('block', body) ('simple', t)."""
    out, i, n = [], 0, len(text)
    while i < n:
        i, node = _stmt(text, i)
        if node is not None:
            out.append(node)
    return out


def _skip_ws(text, i):
    while i < len(text) and text[i] in " \t\r\n;":
        i += 1
    return i


def _stmt(text: str, i: int):
    i = _skip_ws(text, i)
    if i >= len(text):
        return i, None
    rest = text[i:]
    if rest.startswith("#"):
        e = text.find("\n", i)
        e = len(text) if e == -1 else e
        return e, ("pragma", text[i:e].strip())
    m = re.match(r"([A-Za-z_]\w*)\s*:(?!:)", rest)
    if m and m.group(1) not in ("default", "public", "private"):
        j, node = _stmt(text, i + m.end())
        if node and node[0] == "for":
            node = ("for", node[1], node[2], m.group(1))
        return j, node
    m = re.match(r"(for|while|if|switch)\s*\(", rest)
    if m:
        po = i + m.end() - 1
        pc = matching(text, po, "(", ")")
        head = text[po + 1:pc]
        j, body = _body(text, pc + 1)
        if m.group(1) == "if":
            k = _skip_ws(text, j)
            els = []
            if re.match(r"else\b", text[k:]):
                j, els = _body(text, k + 4)
            return j, ("if", head, body, els)
        if m.group(1) == "switch":
            return j, ("switch", head, _cases(body))
        return j, ("for", head if m.group(1) == "for" else "", body, "")
    if re.match(r"do\b", rest):
        j, body = _body(text, i + 2)
        k = text.find(";", j)
        return k + 1, ("for", "", body, "")
    if rest.startswith("{"):
        c = matching(text, i, "{", "}")
        return c + 1, ("block", parse_stmts(text[i + 1:c]))
    m = re.match(r"(case\b[^:]*|default)\s*:(?!:)", rest)
    if m:
        return i + m.end(), ("case", m.group(1))
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == ";" and depth == 0:
            break
        j += 1
    return j + 1, ("simple", text[i:j].strip())


def _body(text, i):
    i = _skip_ws(text, i) if text[i:i + 1] != ";" else i
    if text[i:i + 1] == "{":
        c = matching(text, i, "{", "}")
        return c + 1, parse_stmts(text[i + 1:c])
    j, node = _stmt(text, i)
    return j, [node] if node else []


def _cases(body: list) -> list[list]:
    cases, cur = [], None
    for node in body:
        if node[0] == "case":
            cur = []
            cases.append(cur)
        elif cur is not None:
            cur.append(node)
    return [[n for n in c if n != ("simple", "break") and n[1:] != ("break",)] for c in cases]


def _pragmas_of(body: list) -> list[str]:
    return [n[1] for n in body if n[0] == "pragma"]


def _ii(pragmas: list[str]) -> int | None:
    for p in pragmas:
        m = re.match(r"#pragma\s+HLS\s+PIPELINE\b(.*)", p, re.I)
        if m:
            if re.search(r"\boff\b", m.group(1), re.I):
                return None
            ii = re.search(r"II\s*=\s*(\d+)", m.group(1), re.I)
            return int(ii.group(1)) if ii else 1
    return None


_CONST_DECL = re.compile(r"\s*(?:static\s+)?(?:constexpr|const)\s+(?:int|long|unsigned|long long)\s+(.+)$", re.S)


def loop_constants(head: str, body: list, env: dict, trips: int | None) -> dict:
    """The integer constants a loop body declares (``const int a = ..., b = ...;``) whose value is
    the same at the loop's first and last trip, its index bound to each in turn: the kernels'
    per-trip flags compare the index with a bound (``i < n ? 0 : 1``), monotone in the index, so
    equal ends mean every trip has that value (the backward kernels' flush step exists only in a
    call with ``flush``: a call without it never takes the step's branch). Empty when the trip
    count or the index is not known."""
    m = re.match(r"\s*(?:[\w:<>]+\s+)?(\w+)\s*=\s*([^;]+);[^;]*;\s*(?:\1\+\+|\+\+\1)\s*$", head or "", re.S)
    if not m or not trips:
        return {}
    try:
        first = eval_expr(m.group(2), env)
    except Unknown:
        return {}
    ends = [dict(env, **{m.group(1): first}), dict(env, **{m.group(1): first + trips - 1})]
    out: dict = {}
    for node in body:
        cm = _CONST_DECL.match(node[1]) if node[0] == "simple" else None
        if not cm:
            continue
        for decl in _declarators(cm.group(1)):
            dm = re.match(r"\s*(\w+)\s*=\s*(.+)$", decl, re.S)
            if not dm:
                continue
            try:
                lo, hi = (eval_expr(dm.group(2), {**e, **out}) for e in ends)
            except Unknown:
                continue
            if lo == hi:
                out[dm.group(1)] = lo
    return out


def _declarators(text: str) -> list[str]:
    """``a = x, b = y`` split at its top-level commas (parentheses only: a ``<`` here compares)."""
    out, depth, start = [], 0, 0
    for k, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(text[start:k])
            start = k + 1
    return out + [text[start:]]


def _loop_scope(scope: "_Scope", head: str, body: list, trips: int | None) -> "_Scope":
    """``scope`` with :func:`loop_constants` of a loop bound (the same scope when there are none)."""
    known = loop_constants(head, body, scope.env, trips)
    if not known:
        return scope
    return _Scope(scope.fname, scope.path, {**scope.env, **known}, scope.names, scope.objs, scope.types, scope.ndims)


def trip_count(head: str, env: dict) -> int | None:
    """Iterations of ``for (init; cond; step)`` with bounds known under ``env``, else None."""
    m = re.match(r"\s*(?:[\w:<>]+\s+)?(\w+)\s*=\s*([^;]+);\s*(\w+)\s*(<=|<|!=)\s*([^;]+);\s*(.+)$", head, re.S)
    if not m or m.group(1) != m.group(3):
        return None
    v, step_t = m.group(1), m.group(6).strip()
    if step_t in (f"{v}++", f"++{v}"):
        step = 1
    else:
        sm = re.match(rf"{v}\s*\+=\s*(.+)$", step_t)
        if not sm:
            return None
        try:
            step = eval_expr(sm.group(1), env)
        except Unknown:
            return None
    try:
        a, b = eval_expr(m.group(2), env), eval_expr(m.group(5), env)
    except Unknown:
        return None
    if m.group(4) == "<=":
        b += 1
    return max(0, math.ceil((b - a) / step)) if step > 0 else None


# --- the walk --------------------------------------------------------------------------------


class _Acc:
    """Accesses of one iteration: decl id -> [reads, writes]; multipliers."""

    def __init__(self):
        self.rw: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.mults: list[tuple[int, int]] = []
        self.unknown: list[str] = []

    def add(self, o: "_Acc", k: int = 1) -> None:
        for d, (r, w) in o.rw.items():
            self.rw[d][0] += r * k
            self.rw[d][1] += w * k
        self.mults += o.mults * k
        self.unknown += o.unknown

    def maxed(self, o: "_Acc") -> None:
        for d, (r, w) in o.rw.items():
            self.rw[d][0] = max(self.rw[d][0], r)
            self.rw[d][1] = max(self.rw[d][1], w)
        if len(o.mults) > len(self.mults):
            self.mults = list(o.mults)
        self.unknown += o.unknown


class _Scope:
    """Names visible in one function instance: variable -> decl id, struct objects, types."""

    def __init__(self, fname, path, env, names, objs, types, ndims=None):
        self.fname, self.path, self.env = fname, path, env
        self.ndims: dict[str, int] = ndims if ndims is not None else {}   # name -> subscripts of one access
        self.names: dict[str, str] = names
        self.objs: dict[str, tuple[str, dict[str, str]]] = objs     # obj -> (struct, member -> decl id)
        self.types: dict[str, str] = types                           # parameter -> type text


class Scanner:
    """Walks one kernel; see the module docstring."""

    def __init__(self, src: Source, top: str, max_depth: int = 14, samples: int = 1, flush: int | None = None):
        self.src, self.top, self.max_depth, self.samples, self.flush = src, top, max_depth, samples, flush
        self.decls: dict[str, Decl] = {}
        self.loops: list[Loop] = []
        self.dataflows: list[Dataflow] = []
        self.problems: list[str] = []
        self._usage_cache: dict = {}

    # -- declarations
    def _body(self, fname: str) -> str:
        return self.src.body(fname)

    def _enter(self, fname: str, env: dict, binds: dict, path: str, top: bool = False) -> tuple[_Scope, str]:
        tparams, _ = self.src.prog.functions[fname]
        body = self._body(fname)
        env = local_constants(body, env)
        names = dict(binds)
        types = {name: typ for typ, name, _ in self.src.sigs.get(fname, [])}
        ndims = {name: len(dims) for _, name, dims in self.src.sigs.get(fname, [])}
        scope = _Scope(fname, path, env, names, {}, types, ndims)
        if top:
            self._top_ports(fname, body, scope)
        self._locals(body, scope)
        self._apply_pragmas(body, scope)
        return scope, body

    def _new(self, d: Decl) -> None:
        self.decls[d.id] = d

    def _top_ports(self, fname: str, body: str, scope: _Scope) -> None:
        iface = {}
        for line in re.findall(r"#pragma\s+HLS\s+INTERFACE\s+([^\n]*)", body, re.I):
            kv = dict(w.split("=", 1) for w in line.split() if "=" in w)
            mode = kv.get("mode") or next((w for w in line.split() if "=" not in w), "")
            if "port" in kv:
                iface[kv["port"]] = (mode.lower(), kv)
        for typ, name, dims in self.src.sigs.get(fname, []):
            mode, kv = iface.get(name, ("", {}))
            if mode == "m_axi":
                try:
                    bits = type_bits(typ, self.src.prog, scope.env)
                except Unknown:
                    bits = 0
                    self.problems.append(f"{fname}: type of port {name} ({typ}) not sized")
                try:
                    depth = [eval_expr(kv["depth"], scope.env)] if "depth" in kv else self._dims(dims, scope.env)
                except Unknown:
                    depth = [0]
                self._new(Decl(f"m_axi:{name}", "m_axi", bits, depth,
                               bundle=kv.get("bundle", "gmem"), widen_bits=int(kv.get("max_widen_bitwidth", 0))))
                scope.names[name] = f"m_axi:{name}"
            elif mode == "axis" or "hls::stream" in typ:
                self._new(Decl(f"axis:{name}", "axis", self._bits_or0(_stream_elem(typ), scope.env), []))
                scope.names[name] = f"axis:{name}"

    def _bits_or0(self, typ: str, env: dict) -> int:
        try:
            return type_bits(typ, self.src.prog, env)
        except Unknown:
            return 0

    def _dims(self, dims: list[str], env: dict):
        try:
            return [eval_expr(d, env) for d in dims]
        except Unknown:
            return [0]

    def _locals(self, body: str, scope: _Scope) -> None:
        for sm in re.finditer(r"hls::stream\s*<", body):
            lt = sm.end() - 1
            gt = matching(body, lt, "<", ">")
            after = re.match(r"\s*(\w+)\s*((?:\[[^\]]+\])*)\s*[;(]", body[gt + 1:])
            if not after:
                continue
            args = split_args(body[lt + 1:gt])
            var = after.group(1)
            try:
                depth = eval_expr(args[1], scope.env) if len(args) > 1 else 0
                count = math.prod(eval_expr(d, scope.env) for d in re.findall(r"\[([^\]]+)\]", after.group(2)))
            except Unknown:
                self.problems.append(f"{scope.path}: stream {var} not sized")
                continue
            d = Decl(f"{scope.path}/{var}", "stream", self._bits_or0(args[0], scope.env), [count] if count > 1 else [],
                     depth=depth)
            self._new(d)
            scope.names[var] = d.id
        for am in re.finditer(r"(?<![\w,(])(static\s+)?(const\s+)?([A-Za-z_][\w:]*(?:\s*<[^;{}()]*?>)?)\s+"
                              r"([A-Za-z_]\w*)\s*((?:\[[^\]]+\])+)\s*(?=[;=])", body):
            tname, var = am.group(3), am.group(4)
            if tname in _KEYWORDS or tname.startswith("hls::stream") or tname in ("return", "else"):
                continue
            try:
                bits = type_bits(tname, self.src.prog, scope.env)
                dims = [eval_expr(x, scope.env) for x in re.findall(r"\[([^\]]+)\]", am.group(5))]
            except Unknown:
                continue
            d = Decl(f"{scope.path}/{var}", "array", bits, dims, static=bool(am.group(1)), const=bool(am.group(2)))
            self._new(d)
            scope.names[var] = d.id
            scope.ndims[var] = len(dims)
        if scope.path.count("/") == 0:   # the top function: file-scope ROMs it names
            for g, (gt_, gdims) in self.src.prog.globals.items():
                if re.search(rf"\b{re.escape(g)}\b", body):
                    try:
                        d = Decl(f"{scope.path}/{g}", "array", type_bits(gt_, self.src.prog, scope.env),
                                 [eval_expr(x, scope.env) for x in gdims], static=True, const=True)
                    except Unknown:
                        continue
                    self._new(d)
                    scope.names[g] = d.id
                    scope.ndims[g] = len(d.dims)

    def _apply_pragmas(self, body: str, scope: _Scope) -> None:
        for line in re.findall(r"#pragma\s+HLS\s+([^\n]*)", body, re.I):
            words = line.split()
            kv = dict(w.split("=", 1) for w in words[1:] if "=" in w)
            var = kv.get("variable")
            if not var or var not in scope.names:
                continue
            d = self.decls[scope.names[var]]
            head = words[0].upper()
            if head == "BIND_STORAGE":
                d.impl = kv.get("impl", "").lower() or None
            elif head in ("ARRAY_PARTITION", "ARRAY_RESHAPE"):
                kind = "complete" if "complete" in words or kv.get("type") == "complete" else \
                    "block" if "block" in words or kv.get("type") == "block" else "cyclic"
                try:
                    factor = eval_expr(kv.get("factor", "0"), scope.env)
                except Unknown:
                    factor = 0
                    self.problems.append(f"{scope.path}: factor of {line.strip()} not known")
                dim = int(kv.get("dim", "1"))
                (d.partitions if head == "ARRAY_PARTITION" else d.reshapes).append((kind, factor, dim))
            elif head == "STREAM" and "depth" in kv:
                d.depth = int(kv["depth"])

    # -- structure
    def run(self) -> KernelScan:
        env = dict(self.src.prog.defines)
        takes_n = any(name == "n" and not dims for _, name, dims in self.src.sigs.get(self.top, []))
        if takes_n:
            env["n"] = self.samples   # the generated kernels' sample count per call
        takes_flush = any(name == "flush" and not dims for _, name, dims in self.src.sigs.get(self.top, []))
        if takes_flush and self.flush is not None:
            env["flush"] = self.flush   # the backward kernels: the call that ends an iteration (None: either)
        scope, body = self._enter(self.top, env, {}, self.top, top=True)
        self._structure(self.src.parsed(body), scope, 0, body, 1)
        return KernelScan(self.top, self.decls, self.loops, self.dataflows, self.problems, takes_n, takes_flush)

    def _structure(self, stmts: list, scope: _Scope, depth: int, body: str | None = None,
                   mult: int | None = 1) -> None:
        """Find the pipelined loops and DATAFLOW regions; ``mult``: executions per sample."""
        pii = _ii(_pragmas_of(stmts))
        if body is not None and pii is not None and scope.fname != self.top:
            self._pipelined(stmts, scope, scope.fname, pii, mult)     # a pipelined function
            return
        dataflow = body is not None and _is_dataflow(stmts, self.src.prog.defines)
        processes, channels = [], defaultdict(list)
        for node in stmts:
            kind = node[0]
            if kind == "for":
                ii = _ii(_pragmas_of(node[2]))
                trips = trip_count(node[1], scope.env)
                inner = None if mult is None or trips is None else mult * trips
                inside = _loop_scope(scope, node[1], node[2], trips)
                if ii is not None:
                    self._pipelined(node[2], inside, node[3] or "loop", ii, inner)
                else:
                    var = re.match(r"\s*(?:[\w:<>]+\s+)?(\w+)", node[1] or "")
                    body_ = [x for x in node[2] if x[0] != "pragma"]
                    if var and len(body_) == 1 and body_[0][0] == "switch" and body_[0][1].strip() == var.group(1):
                        inner = mult    # a dispatch over the turns: each case runs once a sweep
                    self._structure(node[2], inside, depth, None, inner)
            elif kind == "if":
                taken = known_cond(node[1], scope.env)
                if taken is not False:
                    if taken and [x for x in node[2] if x[0] != "pragma"] == [("simple", "return")]:
                        break   # `if (!flush) return;` with flush known: the rest does not run
                    self._structure(node[2], scope, depth, None, mult)
                if taken is not True:
                    self._structure(node[3], scope, depth, None, mult)
            elif kind == "switch":
                for c in node[2]:
                    self._structure(c, scope, depth, None, mult)
            elif kind == "block":
                self._structure(node[1], scope, depth, None, mult)
            elif kind == "simple":
                self._object(node[1], scope)
                for callee, args, targs in self._calls(node[1], scope):
                    if depth >= self.max_depth:
                        continue
                    sub = self._bind(callee, args, targs, scope)
                    cpath = f"{scope.path}/{callee}"
                    if dataflow:
                        cpath = f"{cpath}#{len(processes)}" if any(p.startswith(cpath) for p in processes) else cpath
                        processes.append(cpath)
                        for p, did in sub[1].items():
                            if did.startswith("axis:") or self.decls[did].kind in ("stream", "array", "m_axi", "axis"):
                                channels[did].append((cpath, self._usage(callee, p, sub[0])))
                    cscope, cbody = self._enter(callee, sub[0], sub[1], cpath)
                    self._structure(self.src.parsed(cbody), cscope, depth + 1, cbody, mult)
        if dataflow and processes:
            self.dataflows.append(Dataflow(scope.path, processes, dict(channels)))

    def _calls(self, text: str, scope: _Scope) -> list[tuple[str, list[str], list[str]]]:
        """Calls of the program's functions in ``text``: (name, arg texts, template arg texts)."""
        got = self.src.calls.get(text)
        if got is None:
            got = self.src.calls[text] = list(self._find_calls(text))
        return got

    def _find_calls(self, text: str):
        k = 0
        while True:
            # the next call at k or after: a name at k itself is not held to what precedes it
            # (the scan resumes there: inside a call's arguments, after its template arguments)
            m = _CALL_AT.match(text, k) or _CALL.search(text, k + 1)
            if not m:
                return
            name = m.group(2)
            k = m.end()
            if name not in self.src.prog.functions or name in _KEYWORDS:
                continue
            name0 = name
            targs = []
            if m.group(3):
                lt = k - 1
                try:
                    gt = matching(text, lt, "<", ">")
                except Unknown:
                    continue
                targs = split_args(text[lt + 1:gt])
                k = gt + 1
            po = k
            while po < len(text) and text[po].isspace():
                po += 1
            if not text.startswith("(", po):
                continue
            pc = matching(text, po, "(", ")")
            args = split_args(text[po + 1:pc])
            yield self._overload(name0, len(args), len(targs)), args, targs
            k = po + 1   # calls inside the arguments too

    def _overload(self, name: str, nargs: int, ntargs: int) -> str:
        """The definition of ``name`` a call with ``nargs`` arguments and ``ntargs`` template
        arguments resolves to (by parameter counts; the first definition otherwise)."""
        keys = [k for k in self.src.sigs if k == name or k.startswith(name + "@")]
        for k in keys:
            tp = self.src.prog.functions.get(k, ([], ""))[0]
            if len(self.src.sigs[k]) == nargs and ntargs <= len(tp):
                return k
        return name

    def _bind(self, callee: str, args: list[str], targs: list[str], scope: _Scope) -> tuple[dict, dict]:
        ctparams, _ = self.src.prog.functions[callee]
        env = dict(self.src.prog.defines)
        for p, a in zip(ctparams, targs):
            try:
                env[p] = eval_expr(a, scope.env)
            except Unknown:
                env[p] = a
        binds = {}
        for (typ, pname, dims), a in zip(self.src.sigs.get(callee, []), args):
            r = _root(a)
            if r in scope.names:
                binds[pname] = scope.names[r]
            elif not dims and _INT_TYPES.match(typ.replace("const ", "")):
                try:   # a scalar argument known here (loop bounds per sample)
                    env[pname] = eval_expr(a, scope.env)
                except Unknown:
                    pass
        return env, binds

    # -- pipelined loops
    def _pipelined(self, body: list, scope: _Scope, label: str, ii: int, iterations: int | None = None) -> None:
        acc = self._acc(body, scope, 0)
        self.loops.append(Loop(scope.path, label, ii, {d: list(v) for d, v in acc.rw.items()}, acc.mults,
                               sorted(set(acc.unknown)), iterations))

    def _acc(self, stmts: list, scope: _Scope, depth: int) -> _Acc:
        acc = _Acc()
        for node in stmts:
            kind = node[0]
            if kind == "simple":
                acc.add(self._acc_text(node[1], scope, depth))
            elif kind == "block":
                acc.add(self._acc(node[1], scope, depth))
            elif kind == "if":
                acc.add(self._acc_text(node[1], scope, depth))
                a, b = self._acc(node[2], scope, depth), self._acc(node[3], scope, depth)
                a.maxed(b)
                acc.add(a)
            elif kind == "switch":
                acc.add(self._acc_text(node[1], scope, depth))
                best = _Acc()
                for c in node[2]:
                    best.maxed(self._acc(c, scope, depth))
                acc.add(best)
            elif kind == "for":
                trips = trip_count(node[1], scope.env)
                if trips is None:
                    acc.unknown.append(f"{scope.path}: for ({node[1].strip()})")
                    trips = 1
                acc.add(self._acc(node[2], scope, depth), trips)
        return acc

    def _acc_text(self, text: str, scope: _Scope, depth: int) -> _Acc:
        acc = _Acc()
        self._object(text, scope)
        decl = _LOCAL_ARRAY.match(text)
        if not decl:
            self._subscripts(text, scope.names, acc, scope.ndims)
        self._streams(text, scope.names, acc)
        # products of two data-typed parameters: the multipliers (DSP48E2, UG579)
        for pm in _PRODUCT.finditer(text):
            a, b = pm.group(1), pm.group(2)
            ta, tb = scope.types.get(a), scope.types.get(b)
            if ta and tb and not _INT_TYPES.match(ta) and not _INT_TYPES.match(tb):
                acc.mults.append((self._bits_or0(ta, scope.env), self._bits_or0(tb, scope.env)))
        # method calls on struct objects bound to arrays (e.g. a weight tile's at())
        called = set()
        for mm in _METHOD_CALL.finditer(text):
            obj = scope.objs.get(mm.group(1))
            pc = matching(text, mm.end() - 1, "(", ")")
            key = (mm.group(1), mm.group(2), _SPACES.sub("", text[mm.end():pc]))
            if key in called:
                continue   # the same element read twice in one statement: one read
            called.add(key)
            if obj and mm.group(2) in self.src.methods.get(obj[0], {}):
                _, mbody = self.src.methods[obj[0]][mm.group(2)]
                mdims = dict(self.src.members.get(obj[0], []))
                mscope = _Scope(scope.fname, scope.path, scope.env, dict(obj[1]), {}, {}, mdims)
                acc.add(self._acc(self.src.parsed(mbody), mscope, depth + 1))
        if depth < self.max_depth:
            for callee, args, targs in self._calls(text, scope):
                env, binds = self._bind(callee, args, targs, scope)
                cscope, cbody = self._enter(callee, env, binds, f"{scope.path}/{callee}")
                for (typ, pname, _), a in zip(self.src.sigs.get(callee, []), args):
                    if _root(a) in scope.objs:
                        cscope.objs[pname] = scope.objs[_root(a)]
                acc.add(self._acc(self.src.parsed(cbody), cscope, depth + 1))
        return acc

    def _object(self, text: str, scope: _Scope) -> None:
        """``Struct<..> obj = {a, b}``: obj's members bound to the arrays a, b name."""
        m = _OBJECT_INIT.match(text)
        if not m or m.group(1) not in self.src.members:
            return
        members = [name for name, _ in self.src.members.get(m.group(1), [])]
        binds = {}
        for mem, init in zip(members, split_args(m.group(3))):
            r = _root(init)
            if r in scope.names:
                binds[mem] = scope.names[r]
        scope.objs[m.group(2)] = (m.group(1), binds)

    def _subscripts(self, text: str, names: dict, acc: _Acc, ndims: dict | None = None) -> None:
        """Reads and writes of named arrays in one statement; the same element read twice in a
        statement (same index text) is one read, as the scheduler shares it."""
        seen = set()
        for name, nsub, key_text, assigns, how in _subscript_sites(text):
            did = names.get(name)
            if not did or did not in self.decls:
                continue
            if nsub < 0:
                raise Unknown(key_text)
            if nsub < (ndims or {}).get(name, 0):
                continue   # an address (a row of the array), not an access
            key = (did, key_text)
            if key in seen and not assigns:
                continue
            seen.add(key)
            if how == "rw":
                acc.rw[did][0] += 1
                acc.rw[did][1] += 1
            elif how == "w":
                acc.rw[did][1] += 1
            else:
                acc.rw[did][0] += 1

    def _streams(self, text: str, names: dict, acc: _Acc) -> None:
        calls, shifts = _stream_sites(text)
        for name, read in calls:
            did = names.get(name)
            if did and did in self.decls:
                acc.rw[did][0 if read else 1] += 1
        for name, read in shifts:
            did = names.get(name)
            if did and did in self.decls and self.decls[did].kind in ("stream", "axis", "probe"):
                acc.rw[did][0 if read else 1] += 1

    # -- channel direction of a parameter (DATAFLOW single reader / writer)
    def _usage(self, fname: str, param: str, env: dict, depth: int = 0) -> str:
        key = (fname, param)
        if key in self._usage_cache:
            return self._usage_cache[key]
        self._usage_cache[key] = ""      # recursion guard
        body = self._body(fname)
        typ = next((t for t, n, _ in self.src.sigs.get(fname, []) if n == param), "")
        acc = _Acc()
        names = {param: "x"}
        self.decls.setdefault("x", Decl("x", "probe", 0, []))
        self._subscripts(body, names, acc)
        self._streams(body, names, acc)
        r, w = acc.rw["x"] if "x" in acc.rw else (0, 0)
        u = ("r" if r else "") + ("w" if w else "")
        if re.search(rf"=\s*\{{\s*{re.escape(param)}\b", body):   # wrapped in a struct object (an initializer): read
            u = u if "r" in u else "r" + u
        if depth < 6:
            scope = _Scope(fname, fname, env, {param: "x"}, {}, {})
            for callee, args, targs in self._calls(body, scope):
                for (t2, p2, _), a in zip(self.src.sigs.get(callee, []), args):
                    if _root(a) == param:
                        sub = self._usage(callee, p2, env, depth + 1)
                        u = "".join(c for c in "rw" if c in u or c in sub)
        if "const" in typ.split():
            u = u.replace("w", "")
        self.decls.pop("x", None)
        self._usage_cache[key] = u
        return u


#: a statement declaring a local array (its subscripts are sizes, not accesses)
_LOCAL_ARRAY = re.compile(r"^(?!(?:return|else|case|delete|throw)\b)(?:static\s+)?(?:const\s+)?[\w:]+"
                          r"(?:\s*<[^;]*?>)?\s+\w+\s*(?:\[[^\]]+\])+\s*$")
_OPERAND = r"\(?\s*(\w+)\s*(?:\[[^\]]*\]\s*)*\)?(?:\.V)?"
#: ``a * b`` of two operands (a multiplier when both are data-typed)
_PRODUCT = re.compile(_OPERAND + r"\s*\*\s*" + _OPERAND)
_METHOD_CALL = re.compile(r"\b(\w+)\s*\.\s*(\w+)\s*\(")
_OBJECT_INIT = re.compile(r"^(?:bapipe::)?(\w+)\s*(?:<.*>)?\s+(\w+)\s*=\s*\{(.*)\}$", re.S)
_SUBSCRIPT = re.compile(r"(?<![\w.>])(\w+)\s*\[")
_ASSIGN_OR_COMPOUND = re.compile(r"(?:[-+*/%&|^]|<<|>>)?=(?!=)")
_COMPOUND = re.compile(r"(?:[-+*/%&|^]|<<|>>)=")
_MEMBER = re.compile(r"\.\s*\w+\s*")
_SPACES = re.compile(r"\s+")
_STREAM_CALL = re.compile(r"\b(\w+)\s*(?:\.|->)\s*(read|write|read_nb|write_nb)\s*\(")
_STREAM_SHIFT = re.compile(r"\b(\w+)\s*(>>|<<)\s*(?!=)")


@functools.lru_cache(maxsize=1 << 14)
def _subscript_sites(text: str) -> tuple[tuple[str, int, str, bool, str], ...]:
    """Every ``name[...]...`` of a text, in order: (name, subscripts, the subscripts' text
    without spaces, whether an assignment follows, access: 'r', 'w' or 'rw' (compound
    assignment, ++/--)). A pure function of the text: what Scanner._subscripts counts, read
    once per text however many scopes read it."""
    out = []
    for m in _SUBSCRIPT.finditer(text):
        j, nsub = m.end() - 1, 0
        try:
            while j < len(text) and text[j] == "[":
                j = matching(text, j, "[", "]") + 1
                nsub += 1
                while j < len(text) and text[j] in " \t":
                    j += 1
        except Unknown as e:   # unbalanced: raised when a scope reads this name (as before)
            out.append((m.group(1), -1, str(e), False, ""))
            continue
        after = text[j:].lstrip()
        key = _SPACES.sub("", text[m.end() - 1:j])
        assigns = bool(_ASSIGN_OR_COMPOUND.match(after))
        while after.startswith("."):   # a member of an element
            mm = _MEMBER.match(after)
            after = after[mm.end():] if mm else after[1:]
        before = text[:m.start()].rstrip()
        if _COMPOUND.match(after) or after.startswith(("++", "--")) or before.endswith(("++", "--")):
            how = "rw"
        elif after.startswith("=") and not after.startswith("=="):
            how = "w"
        else:
            how = "r"
        out.append((m.group(1), nsub, key, assigns, how))
    return tuple(out)


@functools.lru_cache(maxsize=1 << 14)
def _stream_sites(text: str) -> tuple[tuple, tuple]:
    """(``x.read(``/``x.write(`` calls, ``x >>``/``x <<`` shifts) of a text, in order, as
    (name, is a read): what Scanner._streams counts, read once per text."""
    calls = tuple((m.group(1), m.group(2).startswith("read")) for m in _STREAM_CALL.finditer(text))
    shifts = tuple((m.group(1), m.group(2) == ">>") for m in _STREAM_SHIFT.finditer(text))
    return calls, shifts


def known_cond(cond: str, env: dict) -> bool | None:
    """The value of an ``if`` condition when the scalars it names are known (the top's ``n`` and
    ``flush``, template arguments), else None: ``!``, ``&&`` and ``||`` over eval_expr's terms; a
    conjunction with one known-false term is false, a disjunction with one known-true term true."""
    def term(t: str) -> bool | None:
        t = t.strip()
        neg = False
        while t.startswith("!") and not t.startswith("!="):
            neg, t = not neg, t[1:].strip()
        if t.startswith("(") and t.endswith(")"):
            inner = known_cond(t[1:-1], env)
            return None if inner is None else inner != neg
        try:
            return bool(eval_expr(t, env)) != neg
        except Unknown:
            return None

    c = cond.strip()
    if "||" in c:
        vals = [known_cond(p, env) for p in c.split("||")]
        return True if True in vals else (None if None in vals else False)
    if "&&" in c:
        vals = [term(p) for p in c.split("&&")]
        return False if False in vals else (None if None in vals else True)
    return term(c)


def _stream_elem(typ: str) -> str:
    m = re.search(r"hls::stream\s*<(.*)>", typ)
    return split_args(m.group(1))[0] if m else typ


_CASTS = re.compile(r"^\s*(?:\([\w\s:<>,*]+\)\s*)*[&*]?\s*")
_WORD = re.compile(r"(\w+)")


@functools.lru_cache(maxsize=1 << 14)
def _root(expr: str) -> str:
    """The variable an argument expression names (casts, ``&`` and ``*`` dropped)."""
    e = _CASTS.sub("", expr.strip())
    m = _WORD.match(e)
    return m.group(1) if m else ""


def _is_dataflow(stmts: list, defines: dict) -> bool:
    for n in stmts:
        if n[0] == "pragma" and re.search(r"HLS\s+DATAFLOW", n[1], re.I):
            return True
        if n[0] == "simple":
            for w in re.findall(r"\b[A-Z_][A-Z0-9_]*\b", n[1]):
                v, seen = defines.get(w, ""), 0
                while v and seen < 5:
                    if "DATAFLOW" in v:
                        return True
                    v = defines.get(v.split("(")[0].strip(), "")
                    seen += 1
    return False


def scan_kernel(files: dict[str, str | bytes], kernel_file: str, top: str, samples: int = 1,
                flush: int | None = None) -> KernelScan:
    """The storage, pipelined loops and DATAFLOW regions of kernel ``top`` in ``kernel_file``;
    loop iterations for a call of ``samples`` samples (the top's ``n``) and, for a kernel
    taking ``flush``, a call with that flush (None: both branches, every loop)."""
    return scan_calls(files, kernel_file, top, [(samples, flush)])[0]


def scan_calls(files: dict[str, str | bytes], kernel_file: str, top: str,
               calls: list[tuple[int, int | None]]) -> list[KernelScan]:
    """:func:`scan_kernel` for several (samples, flush) calls of one kernel, its sources read once."""
    src = read_source(files, kernel_file)
    if top not in src.prog.functions:
        raise Unknown(f"function {top}")
    return [Scanner(src, top, samples=n, flush=f).run() for n, f in calls]
