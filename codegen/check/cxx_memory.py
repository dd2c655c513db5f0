"""On-chip bytes of a generated HLS kernel, read from its C++ declarations alone.

An independent check of the Design's figure (codegen.design.onchip): starting at the kernel's top
function, every call is followed into the engine/layer templates with their template
arguments bound (one hardware instance per call site, as DATAFLOW instantiates them), and
every storage declaration is sized:

- arrays (static or local, in the kernel or its engines) and the file-scope ROMs the kernel
  names: elements x bits of the element type;
- ``hls::stream<T, DEPTH>`` (or ``hls::stream<T>`` with ``#pragma HLS STREAM depth=``; 2 when
  neither says): DEPTH x bits of T;
- ``#pragma HLS BIND_STORAGE variable=x impl=...`` sorts each into BRAM, URAM, LUTRAM/SRL or
  unspecified; arrays partitioned completely in every dimension are registers.

Types are sized from the build's own typedefs/aliases/structs (ap_fixed/ap_int widths,
``vec<L>`` members, ...), with the ``__SYNTHESIS__`` branch of preprocessor conditionals.
Pure functions of the rendered files (path -> text); nothing is compiled.
"""
from __future__ import annotations

import ast
import functools
import math
import operator
import re
from dataclasses import dataclass, field
from bapipe.codegen.design.cxx_text import split_args

#: bits of C/C++ scalar types
_SCALARS = {"bool": 8, "char": 8, "signed char": 8, "unsigned char": 8, "short": 16, "unsigned short": 16,
            "int": 32, "unsigned": 32, "unsigned int": 32, "long": 64, "unsigned long": 64, "long long": 64,
            "unsigned long long": 64, "float": 32, "double": 64, "int8_t": 8, "uint8_t": 8, "int16_t": 16,
            "uint16_t": 16, "int32_t": 32, "uint32_t": 32, "int64_t": 64, "uint64_t": 64, "half": 16}
_AP = re.compile(r"^(?:ap_fixed|ap_ufixed|ap_int|ap_uint)$")
_KEYWORDS = {"return", "else", "case", "goto", "delete", "new", "throw", "typedef", "using", "if", "for",
             "while", "do", "switch", "sizeof"}


class Unknown(Exception):
    """An expression or type the reader cannot size."""


# --- preprocessing ---------------------------------------------------------------------------


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def preprocess(text: str, defines: dict[str, str], macros: dict[str, tuple[list[str], str]] | None = None) -> str:
    """Keep the lines a synthesis build sees (``__SYNTHESIS__`` defined); collect #defines
    (and, given ``macros``, the function-like ones: name -> (params, body)).
    Include guards and unknown macros count as undefined, ``#if 0`` as false."""
    out, stack = [], []   # stack of (this branch active, some branch taken)
    active = True
    for line in strip_comments(text).splitlines():
        s = line.strip()
        m = re.match(r"#\s*(\w+)\s*(.*)", s)
        if not m:
            if active:
                out.append(line)
            continue
        d, rest = m.group(1), m.group(2).strip()
        if d in ("if", "ifdef", "ifndef"):
            if d == "ifdef":
                cond = rest in defines or rest == "__SYNTHESIS__"
            elif d == "ifndef":
                cond = not (rest in defines or rest == "__SYNTHESIS__") or rest.endswith("_H")
            else:
                cond = _pp_cond(rest, defines)
            stack.append((active, cond))
            active = active and cond
        elif d == "elif":
            parent, taken = stack[-1]
            cond = not taken and _pp_cond(rest, defines)
            stack[-1] = (parent, taken or cond)
            active = parent and cond
        elif d == "else":
            parent, taken = stack[-1]
            stack[-1] = (parent, True)
            active = parent and not taken
        elif d == "endif":
            parent, _ = stack.pop()
            active = parent
        elif d == "define" and active:
            dm = re.match(r"(\w+)(?!\()\s*(.*)", rest)
            if dm and not re.match(r"\w+\(", rest):
                defines[dm.group(1)] = dm.group(2).strip()
            fm = re.match(r"(\w+)\(([^)]*)\)\s*(.*)", rest)
            if fm and macros is not None:
                macros[fm.group(1)] = ([a.strip() for a in fm.group(2).split(",") if a.strip()], fm.group(3).strip())
        elif d == "pragma" and active:
            out.append(s)
    return "\n".join(out)


def _pp_cond(expr: str, defines: dict[str, str]) -> bool:
    def dfn(m):
        name = m.group(1) or m.group(2)
        return "1" if name == "__SYNTHESIS__" or name in defines else "0"
    e = re.sub(r"defined\s*\(\s*(\w+)\s*\)|defined\s+(\w+)", dfn, expr)
    e = e.replace("&&", " and ").replace("||", " or ").replace("!", " not ")
    try:
        return bool(eval_expr(e, {k: v for k, v in defines.items()}))
    except Unknown:
        return False


# --- expressions -------------------------------------------------------------------------------

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
        ast.BitAnd: operator.and_, ast.BitOr: operator.or_}
_CMP = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
        ast.Eq: operator.eq, ast.NotEq: operator.ne}


def eval_expr(expr: str, env: dict) -> int:
    """A C integer expression (+ - * / % << >> & |, comparisons, ?:, casts to int/long)."""
    tree = _parsed(str(expr))
    if tree is None:
        raise Unknown(expr)
    return _ev(tree.body, env, 0)


@functools.lru_cache(maxsize=1 << 16)
def _parsed(expr: str) -> ast.Expression | None:
    """The Python tree of a C integer expression (None: not one); parsed once per text, as the
    physical-rules scan evaluates the same bounds in every call site and every scanned call."""
    e = expr.strip()
    e = re.sub(r"\((?:long long|long|int|unsigned|size_t)\)", "", e)
    e = re.sub(r"(\d+)(?:ULL|LL|UL|L|U)\b", r"\1", e)
    e = e.replace("true", "1").replace("false", "0")
    e = re.sub(r"(?<![/])/(?![/])", "//", e)
    e = re.sub(r"\bbapipe::", "", e)
    # a ? b : c -> (b if a else c), innermost first
    for _ in range(8):
        m = re.search(r"([^?:()]+)\?([^?:()]+):([^?:()]+)", e)
        if not m:
            break
        e = e[:m.start()] + f"(({m.group(2)}) if ({m.group(1)}) else ({m.group(3)}))" + e[m.end():]
    try:
        return ast.parse(e, mode="eval")
    except SyntaxError:
        return None


def _ev(n, env, depth):
    if depth > 40:
        raise Unknown("too deep")
    if isinstance(n, ast.Constant) and isinstance(n.value, (int, bool)):
        return int(n.value)
    if isinstance(n, ast.Name):
        if n.id not in env:
            raise Unknown(n.id)
        v = env[n.id]
        return v if isinstance(v, int) else eval_expr(v, env) if isinstance(v, str) else _raise(n.id)
    if isinstance(n, ast.BinOp) and type(n.op) in _BIN:
        a, b = _ev(n.left, env, depth + 1), _ev(n.right, env, depth + 1)
        if isinstance(n.op, (ast.FloorDiv, ast.Mod)) and b == 0:
            raise Unknown("division by 0")
        if isinstance(n.op, ast.FloorDiv):   # C truncates towards 0
            return int(a / b) if (a < 0) != (b < 0) else a // b
        return _BIN[type(n.op)](a, b)
    if isinstance(n, ast.UnaryOp):
        v = _ev(n.operand, env, depth + 1)
        return {ast.USub: -v, ast.UAdd: v, ast.Not: int(not v), ast.Invert: ~v}[type(n.op)]
    if isinstance(n, ast.Compare) and len(n.ops) == 1 and type(n.ops[0]) in _CMP:
        return int(_CMP[type(n.ops[0])](_ev(n.left, env, depth + 1), _ev(n.comparators[0], env, depth + 1)))
    if isinstance(n, ast.BoolOp):
        vals = [_ev(v, env, depth + 1) for v in n.values]
        return int(all(vals) if isinstance(n.op, ast.And) else any(vals))
    if isinstance(n, ast.IfExp):
        return _ev(n.body if _ev(n.test, env, depth + 1) else n.orelse, env, depth + 1)
    raise Unknown(ast.dump(n)[:60])


def _raise(name):
    raise Unknown(name)


def matching(text: str, i: int, open_: str, close: str) -> int:
    """Index of the bracket closing the one at ``text[i]``."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_:
            depth += 1
        elif text[j] == close:
            depth -= 1
            if depth == 0:
                return j
    raise Unknown(f"unbalanced {open_}")


# --- the program: types, functions, globals ------------------------------------------------------


@dataclass
class Program:
    defines: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, tuple[list[str], str]] = field(default_factory=dict)       # name -> (params, type)
    structs: dict[str, tuple[list[str], list[tuple[str, str]]]] = field(default_factory=dict)
    functions: dict[str, tuple[list[str], str]] = field(default_factory=dict)    # name -> (tparams, body)
    globals: dict[str, tuple[str, list[str]]] = field(default_factory=dict)       # ROM name -> (type, dims)
    pragmas: list[str] = field(default_factory=list)


_TEMPLATE = re.compile(r"template\s*<")


def _tparams(text: str) -> list[str]:
    return [p.split()[-1].split("=")[0].strip() for p in split_args(text) if p.split()]


def parse_program(texts: list[str]) -> Program:
    prog = Program()
    for raw in texts:
        text = preprocess(raw, prog.defines)
        _scan(text, prog)
    return prog


def _scan(text: str, prog: Program) -> None:
    i, n = 0, len(text)
    depth_ns = 0
    while i < n:
        m = re.compile(r"template\s*<|namespace\s+\w+\s*\{|typedef\s|using\s+\w+\s*=|struct\s+\w+\s*\{|"
                       r"static\s+const\s|const\s+[\w:<>, ]+\s+\w+\s*\[|"
                       r"[\w:<>, *&]+\s+(\w+)\s*\(").search(text, i)
        if not m:
            break
        tok = m.group(0)
        if tok.startswith("namespace"):
            depth_ns += 1
            i = m.end()
            continue
        tparams: list[str] = []
        j = m.start()
        if tok.startswith("template"):
            lt = text.index("<", j)
            gt = matching(text, lt, "<", ">")
            tparams = _tparams(text[lt + 1:gt])
            j = gt + 1
            rest = text[j:].lstrip()
            j = n - len(rest)
        stmt_end = _decl(text, j, tparams, prog)
        i = max(stmt_end, m.end())


def _decl(text: str, j: int, tparams: list[str], prog: Program) -> int:
    """Parse one declaration at ``j`` (after any template header); returns where it ends."""
    rest = text[j:]
    m = re.match(r"typedef\s+(.+?)\s+(\w+)\s*;", rest, re.S)
    if m:
        prog.aliases[m.group(2)] = (tparams, m.group(1).strip())
        return j + m.end()
    m = re.match(r"using\s+(\w+)\s*=\s*(.+?)\s*;", rest, re.S)
    if m:
        prog.aliases[m.group(1)] = (tparams, m.group(2).strip())
        return j + m.end()
    m = re.match(r"struct\s+(\w+)\s*\{", rest)
    if m:
        close = matching(text, j + m.end() - 1, "{", "}")
        body = text[j + m.end():close]
        members = []
        for dm in re.finditer(r"([\w:]+(?:\s*<[^;{}]*?>)?)\s+(\w+)\s*((?:\[[^\]]+\])*)\s*;", body):
            members.append((dm.group(1), dm.group(2) + dm.group(3)))
        prog.structs[m.group(1)] = (tparams, members)
        return close + 1
    m = re.match(r"(?:static\s+)?const\s+([\w:]+(?:\s*<[^;{}]*?>)?)\s+(\w+)\s*((?:\[[^\]]+\])+)\s*(=|;)", rest)
    if m:   # a file-scope ROM
        prog.globals[m.group(2)] = (m.group(1), re.findall(r"\[([^\]]+)\]", m.group(3)))
        end = text.find(";", j + m.end()) if m.group(4) == "=" else j + m.end()
        if m.group(4) == "=":
            brace = text.find("{", j + m.end())
            if brace != -1 and brace < text.find(";", j + m.end()):
                end = text.find(";", matching(text, brace, "{", "}"))
        return end + 1
    m = re.match(r"(?:static\s+|inline\s+)*[\w:<>, *&]+?\s+(\w+)\s*\(", rest)
    if m:
        po = j + m.end() - 1
        pc = matching(text, po, "(", ")")
        k = pc + 1
        while k < len(text) and text[k] in " \t\n":
            k += 1
        if k < len(text) and text[k] == "{":
            close = matching(text, k, "{", "}")
            name = m.group(1)
            if name not in _KEYWORDS:
                prog.functions.setdefault(name, (tparams, text[k + 1:close]))
            return close + 1
        return k + 1
    nxt = text.find(";", j)
    return (nxt + 1) if nxt != -1 else len(text)


# --- sizing --------------------------------------------------------------------------------------


def type_bits(t: str, prog: Program, env: dict, depth: int = 0) -> int:
    """Storage bits of type ``t`` under template bindings ``env``."""
    if depth > 20:
        raise Unknown(t)
    t = re.sub(r"\b(const|volatile|static|typename|struct)\b", "", t).strip()
    t = re.sub(r"^(?:bapipe|hls|std)::", "", t).strip()
    t = " ".join(t.split())
    if t in _SCALARS:
        return _SCALARS[t]
    m = re.match(r"^([\w:]+)\s*<(.*)>$", t, re.S)
    name, args = (m.group(1), split_args(m.group(2))) if m else (t, [])
    name = re.sub(r"^(?:bapipe|hls)::", "", name)
    if _AP.match(name):
        return eval_expr(args[0], env)
    if name in prog.aliases:
        params, target = prog.aliases[name]
        sub = dict(env)
        for p, a in zip(params, args):
            sub[p] = _arg_value(a, env)
        return type_bits(target, prog, sub, depth + 1)
    if name in prog.structs:
        params, members = prog.structs[name]
        sub = dict(env)
        for p, a in zip(params, args):
            sub[p] = _arg_value(a, env)
        total = 0
        for mt, decl in members:
            dims = re.findall(r"\[([^\]]+)\]", decl)
            total += type_bits(mt, prog, sub, depth + 1) * math.prod(eval_expr(d, sub) for d in dims)
        return total
    raise Unknown(t)


def _arg_value(a: str, env: dict):
    """A template argument's value: an int when it evaluates, else the text (a type)."""
    try:
        return eval_expr(a, env)
    except Unknown:
        return a


@dataclass
class Item:
    """One storage declaration of the kernel's hardware."""

    path: str           # call path: kernel/engine/... name
    kind: str           # array | rom | stream
    bits: int
    storage: str        # bram | uram | lutram | register | fifo | unspecified

    @property
    def bytes(self) -> float:
        return self.bits / 8


_STREAM = re.compile(r"hls::stream\s*<")
_ARRAY = re.compile(r"(?:\bstatic\s+)?(?:\bconst\s+)?([A-Za-z_][\w:]*(?:\s*<[^;{}()]*?>)?)\s+([A-Za-z_]\w*)\s*"
                    r"((?:\[[^\]]+\])+)\s*(?=[;=])")
_CALL = re.compile(r"(?<![\w.>])((?:\w+::)*)(\w+)\s*(<)?")


def _pragmas(body: str) -> dict[str, dict]:
    """variable -> {'impl': ..., 'complete_dims': set, 'depth': n} from the body's pragmas."""
    out: dict[str, dict] = {}
    for line in re.findall(r"#pragma\s+HLS\s+([^\n]*)", body):
        words = line.split()
        kv = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        var = kv.get("variable")
        if not var:
            continue
        d = out.setdefault(var, {"impl": None, "complete_dims": set(), "depth": None})
        head = words[0].upper()
        if head == "BIND_STORAGE":
            d["impl"] = kv.get("impl", "").lower() or None
        elif head == "ARRAY_PARTITION" and "complete" in words:
            d["complete_dims"].add(int(kv.get("dim", "1")))
        elif head == "STREAM" and "depth" in kv:
            d["depth"] = int(kv["depth"])
    return out


def kernel_items(prog: Program, top: str, max_depth: int = 12) -> list[Item]:
    """Every storage declaration reachable from function ``top`` (see the module docstring)."""
    items: list[Item] = []
    if top not in prog.functions:
        raise Unknown(f"function {top}")
    _walk(prog, top, {k: v for k, v in prog.defines.items()}, top, items, 0, max_depth, top_level=True)
    return items


def _word(bits: int) -> int:
    """Bits one element occupies, counted in whole bytes (as the Design counts them)."""
    return 8 * math.ceil(bits / 8)


def _storage(impl: str | None, dims: list[int], complete: set[int]) -> str:
    if dims and (0 in complete or all(i + 1 in complete for i in range(len(dims)))):
        return "register"
    if impl in ("bram", "uram"):
        return impl
    if impl in ("lutram", "srl", "memory_lutram"):
        return "lutram"
    return "unspecified"


def local_constants(body: str, env: dict) -> dict:
    """``env`` with a function body's integer constants (``const int N = ...;``) evaluated in it;
    one that cannot be evaluated is left out."""
    env = dict(env)
    for cm in re.finditer(r"(?:static\s+)?(?:constexpr|const)\s+(?:int|long|unsigned|long long)\s+(\w+)\s*=\s*"
                          r"([^;]+);", body):
        try:
            env[cm.group(1)] = eval_expr(cm.group(2), env)
        except Unknown:
            pass
    return env


def _walk(prog: Program, fname: str, env: dict, path: str, items: list[Item], depth: int, max_depth: int,
          top_level: bool = False) -> None:
    tparams, body = prog.functions[fname]
    env = local_constants(body, env)
    prag = _pragmas(body)
    # streams
    for sm in _STREAM.finditer(body):
        lt = sm.end() - 1
        gt = matching(body, lt, "<", ">")
        after = re.match(r"\s*(\w+)\s*((?:\[[^\]]+\])*)\s*[;(]", body[gt + 1:])
        if not after:
            continue   # a parameter (&name) or a cast
        args = split_args(body[lt + 1:gt])
        var = after.group(1)
        count = math.prod(eval_expr(d, env) for d in re.findall(r"\[([^\]]+)\]", after.group(2)))
        depth_v = eval_expr(args[1], env) if len(args) > 1 else (prag.get(var, {}).get("depth") or 2)
        items.append(Item(f"{path}/{var}", "stream", _word(type_bits(args[0], prog, env)) * depth_v * count, "fifo"))
    # arrays
    for am in _ARRAY.finditer(body):
        tname, var, dimtext = am.group(1), am.group(2), am.group(3)
        if tname in _KEYWORDS or tname.startswith("hls::stream"):
            continue
        try:
            bits = type_bits(tname, prog, env)
            dims = [eval_expr(d, env) for d in re.findall(r"\[([^\]]+)\]", dimtext)]
        except Unknown:
            continue
        p = prag.get(var, {})
        items.append(Item(f"{path}/{var}", "array", _word(bits) * math.prod(dims),
                          _storage(p.get("impl"), dims, p.get("complete_dims", set()))))
    # file-scope ROMs the top function names
    if top_level:
        for g, (gt_, gdims) in prog.globals.items():
            if re.search(rf"\b{re.escape(g)}\b", body):
                dims = [eval_expr(d, env) for d in gdims]
                p = prag.get(g, {})
                items.append(Item(f"{path}/{g}", "rom", _word(type_bits(gt_, prog, env)) * math.prod(dims),
                                  _storage(p.get("impl"), dims, p.get("complete_dims", set()))))
    if depth >= max_depth:
        return
    # calls into known functions, template arguments bound
    k = 0
    while True:
        cm = _CALL.search(body, k)
        if not cm:
            break
        name = cm.group(2)
        k = cm.end()
        if name not in prog.functions or name == fname:
            continue
        targs: list[str] = []
        if cm.group(3):
            lt = cm.end() - 1
            try:
                gt = matching(body, lt, "<", ">")
            except Unknown:
                continue
            targs = split_args(body[lt + 1:gt])
            after = body[gt + 1:].lstrip()
            k = gt + 1
        else:
            after = body[cm.end():].lstrip()
        if not after.startswith("("):
            continue
        ctparams, _ = prog.functions[name]
        sub = {kk: v for kk, v in prog.defines.items()}
        for p_, a in zip(ctparams, targs):
            sub[p_] = _arg_value(a, env)
        _walk(prog, name, sub, f"{path}/{name}", items, depth + 1, max_depth)


@dataclass
class KernelMemory:
    """On-chip storage of one kernel, by where it goes."""

    kernel: str
    items: list[Item]

    def bytes(self, *storages: str) -> int:
        return math.ceil(sum(i.bits for i in self.items if not storages or i.storage in storages) / 8)

    @property
    def total(self) -> int:
        """Every byte of on-chip storage except registers."""
        return self.bytes("bram", "uram", "lutram", "unspecified", "fifo")

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "total": self.total,
                **{s: self.bytes(s) for s in ("bram", "uram", "lutram", "unspecified", "fifo", "register")}}


def file_text(files: dict[str, str | bytes], path: str) -> str:
    """A rendered file's text (the renderers hand bytes or str)."""
    v = files[path]
    return v.decode() if isinstance(v, bytes) else v


def include_order(files: dict[str, str | bytes], kernel_file: str) -> list[str]:
    """``kernel_file`` and the files it includes, included ones first (quoted includes resolved
    in its folder, then common/; the csim-only stream header left out)."""
    folder = kernel_file.rsplit("/", 1)[0] if "/" in kernel_file else ""
    order, seen = [], set()

    def visit(p):
        if p in seen:
            return
        seen.add(p)
        for inc in re.findall(r'#\s*include\s+"([^"]+)"', file_text(files, p)):
            for cand in (f"{folder}/{inc}" if folder else inc, f"common/{inc}"):
                if cand in files and "csim/" not in cand:
                    visit(cand)
                    break
        order.append(p)

    visit(kernel_file)
    return order


def kernel_memory(files: dict[str, str | bytes], kernel_file: str, top: str) -> KernelMemory:
    """The on-chip memory of kernel ``top`` defined in ``kernel_file``, reading the files it
    includes (:func:`include_order`) from ``files``."""
    order = include_order(files, kernel_file)
    prog = parse_program([file_text(files, p) for p in order])
    return KernelMemory(top, kernel_items(prog, top))
