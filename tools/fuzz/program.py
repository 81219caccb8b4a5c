"""The fuzzer's program IR, its TC text, and a concrete analysis of its ranges and value
bounds.

Programs are built as IR rather than text so that the generator and the shrinker can
ask, for concrete sizes, what the front end will infer (index ranges, tensor shapes)
and how large any value can get. Every value must stay an integer of magnitude below
2**24: then float32 holds it exactly, int32 never overflows, and every evaluation order
of + - * min max (any tiling, fusion, vectorisation, reduction order) gives the same
bits, so outputs can be compared with exact equality. A program's float tensors may
be half-precision (`Program.float_type`): its values are computed in float32 all the
same and rounded, deterministically, where they are stored, so the equality holds.
The exception is a `smooth` program (the generator's chains of exponentials): its
values are real and unbounded, and it is compared within a tolerance instead.

The range analysis mirrors the range inference of docs/language.md on concrete numbers: where
clauses first, then rounds in which each unsolved variable takes the intersection of the
conditions `0 <= subscript < extent` in which every other variable is solved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

LIMIT = 2**24  # magnitudes below this are exact in float32 and safe in int32

FLOAT, INT = "float", "int32"
FLOAT_TYPES = ("float", "float16", "bfloat16")
"""What a program's float tensors and casts are declared as (`Program.float_type`)."""


# --- IR ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lin:
    """An affine subscript: sum of coeff*var, plus const."""

    terms: tuple[tuple[str, int], ...]
    const: int = 0

    def render(self) -> str:
        parts = [v if c == 1 else f"{c}*{v}" for v, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


@dataclass(frozen=True)
class Gather:
    """A subscript that reads an int32 input: `T(I(b), d)`."""

    tensor: str
    subs: tuple[Lin, ...]

    def render(self) -> str:
        return f"{self.tensor}({', '.join(s.render() for s in self.subs)})"


Sub = Lin | Gather


@dataclass(frozen=True)
class Num:
    value: int
    ty: str


@dataclass(frozen=True)
class Var:
    """An index variable or a size symbol used as an int32 value."""

    name: str


@dataclass(frozen=True)
class Read:
    tensor: str
    subs: tuple[Sub, ...]


@dataclass(frozen=True)
class Bin:
    op: str  # + - * / %   (/ and % only on int32 by a positive literal)
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Call:
    fn: str  # min max (keywords) or an exact builtin: fabs fmin fmax fma pow floor ...
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Neg:
    a: Expr


@dataclass(frozen=True)
class Cast:
    ty: str
    a: Expr


@dataclass(frozen=True)
class Cond:
    """`a cmp b ? then : orelse`."""

    cmp: str
    a: Expr
    b: Expr
    then: Expr
    orelse: Expr


Expr = Num | Var | Read | Bin | Call | Neg | Cast | Cond


@dataclass(frozen=True)
class Bound:
    """A where-clause bound: `sym + offset` (sym None for a constant)."""

    sym: str | None
    offset: int

    def render(self) -> str:
        if self.sym is None:
            return str(self.offset)
        if self.offset == 0:
            return self.sym
        return f"{self.sym}{self.offset:+d}"

    def value(self, sizes: dict[str, int]) -> int:
        return (sizes[self.sym] if self.sym else 0) + self.offset


@dataclass(frozen=True)
class Stmt:
    tensor: str
    indices: tuple[str, ...]
    op: str  # = += *= min= max= and the ! forms
    rhs: Expr
    where: tuple[tuple[str, Bound, Bound], ...] = ()


@dataclass(frozen=True)
class Decl:
    name: str
    ty: str
    dims: tuple[str | int, ...]


@dataclass(frozen=True)
class Program:
    name: str
    inputs: tuple[Decl, ...]
    outputs: tuple[str, ...]
    stmts: tuple[Stmt, ...]
    sizes: dict[str, int] = field(default_factory=dict)
    nan: bool = False  # inputs may hold NaN (so no float -> int casts are generated)
    float_type: str = FLOAT  # one of FLOAT_TYPES
    # real values (exponentials, logarithms, quotients), unbounded: checked against the
    # reference within a tolerance (`tcpy.fuzz_tasks.SMOOTH`), not bit for bit
    smooth: bool = False

    def render(self) -> str:
        params = ", ".join(_render_decl(d) for d in self.inputs)
        body = "".join(f"    {render_stmt(s)}\n" for s in self.stmts)
        text = f"def {self.name}({params}) -> ({', '.join(self.outputs)}) {{\n{body}}}\n"
        if self.float_type == FLOAT:
            return text
        from tcpy.parser.parse import retyped
        from tcpy.types import ScalarType

        return retyped(text, ScalarType.from_name(self.float_type))


def _render_decl(d: Decl) -> str:
    dims = f"({', '.join(str(x) for x in d.dims)})" if d.dims else ""
    return f"{d.ty}{dims} {d.name}"


def render_stmt(s: Stmt) -> str:
    lhs = f"{s.tensor}({', '.join(s.indices)})" if s.indices else s.tensor
    text = f"{lhs} {s.op} {render(s.rhs)}"
    if s.where:
        text += " where " + ", ".join(
            f"{v} in {lo.render()}:{hi.render()}" for v, lo, hi in s.where
        )
    return text


def render(e: Expr) -> str:
    match e:
        case Num(value=v, ty=ty):
            text = f"{abs(v)}.0" if ty == FLOAT else str(abs(v))
            return f"(-{text})" if v < 0 else text
        case Var(name=n):
            return n
        case Read(tensor=t, subs=subs):
            return f"{t}({', '.join(s.render() for s in subs)})" if subs else t
        case Bin(op=op, a=a, b=b):
            return f"({render(a)} {op} {render(b)})"
        case Call(fn=fn, args=args):
            return f"{fn}({', '.join(render(x) for x in args)})"
        case Neg(a=a):
            return f"(-{render(a)})"
        case Cast(ty=ty, a=a):
            return f"{ty}({render(a)})"
        case Cond(cmp=c, a=a, b=b, then=t, orelse=o):
            return f"({render(a)} {c} {render(b)} ? {render(t)} : {render(o)})"
    raise TypeError(e)


def children(e: Expr) -> tuple[Expr, ...]:
    match e:
        case Bin(a=a, b=b):
            return (a, b)
        case Call(args=args):
            return args
        case Neg(a=a) | Cast(a=a):
            return (a,)
        case Cond(a=a, b=b, then=t, orelse=o):
            return (a, b, t, o)
    return ()


def reads(e: Expr) -> list[Read]:
    out = [e] if isinstance(e, Read) else []
    for c in children(e):
        out += reads(c)
    return out


def index_vars(e: Expr) -> set[str]:
    """Variables in subscripts (gathers included) and used as values."""
    names = subscript_vars(e)
    if isinstance(e, Var):
        names.add(e.name)
    for c in children(e):
        names |= index_vars(c)
    return names


def subscript_vars(e: Expr) -> set[str]:
    """Variables in the subscripts of the reads of `e` (gathers included)."""
    names: set[str] = set()
    for r in reads(e):
        for s in r.subs:
            for lin in s.subs if isinstance(s, Gather) else (s,):
                names.update(v for v, _ in lin.terms)
    return names


# --- analysis -------------------------------------------------------------------------


class Invalid(Exception):
    """The program is not one the fuzzer may use at these sizes (not a compiler bug)."""


@dataclass
class Info:
    """What the analysis knows after a prefix of statements."""

    types: dict[str, str]
    shapes: dict[str, tuple[int, ...]]
    bounds: dict[str, int]  # magnitude bound of every tensor's values
    gather_extent: dict[str, int]  # least extent each index tensor subscripts


def analyze(p: Program) -> Info:
    """Ranges, shapes and value bounds of `p` at `p.sizes`; raises `Invalid`. Two
    passes: the first finds the inputs that subscript a tensor (a gather), whose values
    reach the extent they index, not 3; the second bounds every value with them."""
    gathers = _analyze(p, {}).gather_extent
    return _analyze(p, gathers)


def _analyze(p: Program, gathers: dict[str, int]) -> Info:
    info = Info({}, {}, {}, {})
    declared = {x for d in p.inputs for x in d.dims if isinstance(x, str)}
    if declared != set(p.sizes):
        raise Invalid("the sizes are not exactly those the inputs declare")
    for d in p.inputs:
        info.types[d.name] = d.ty
        info.shapes[d.name] = tuple(p.sizes[x] if isinstance(x, str) else x for x in d.dims)
        info.bounds[d.name] = max(gathers[d.name] - 1, 3) if d.name in gathers else 3
    for s in p.stmts:
        _statement(p, s, info)
    for d in p.inputs:
        if d.name in info.gather_extent:
            if d.ty != INT:
                raise Invalid(f"{d.name} subscripts a tensor but is not int32")
            info.bounds[d.name] = max(info.gather_extent[d.name] - 1, 0)
    return info


def _statement(p: Program, s: Stmt, info: Info) -> None:
    ranges = solve(s, p.sizes, info.shapes)
    new = s.tensor not in info.shapes
    if new and any(ranges[v][0] != 0 for v in s.indices):
        raise Invalid(f"{s.tensor} would not start at 0")
    _check_subscripts(s, ranges, info)
    env = {**{n: (0, v + 1) for n, v in p.sizes.items()}, **ranges}
    ty = type_of(s.rhs, info.types)
    if new:
        info.types[s.tensor] = ty
        info.shapes[s.tensor] = tuple(ranges[v][1] for v in s.indices)
    elif info.types[s.tensor] == INT and ty == FLOAT:
        raise Invalid("a float value stored into an int32 tensor")
    if p.smooth:  # real values: compared within a tolerance, no bound kept
        info.bounds.setdefault(s.tensor, 0)
        return
    b = bound(s.rhs, env, info.bounds)
    length = math.prod(hi - lo for v, (lo, hi) in ranges.items() if v not in s.indices)
    old = 0 if (new or s.op.endswith("!")) else info.bounds[s.tensor]
    match s.op.rstrip("!"):
        case "=":
            total = max(b, info.bounds.get(s.tensor, 0))
        case "+=":
            total = old + length * b
        case "*=":
            # saturate: b**length is astronomically large long before the product ends
            grows = b > 1 and length * math.log2(b) + math.log2(max(old, 1)) >= math.log2(LIMIT)
            total = LIMIT if grows else max(old, 1) * (b**length if b > 1 else 1)
        case _:
            total = max(old, b)
    if total >= LIMIT:
        raise Invalid(f"values of {s.tensor} may reach 2**{total.bit_length() - 1} or more")
    info.bounds[s.tensor] = max(total, info.bounds.get(s.tensor, 0))


def solve(
    s: Stmt, sizes: dict[str, int], shapes: dict[str, tuple[int, ...]]
) -> dict[str, tuple[int, int]]:
    """Concrete [lo, hi) of every index of `s`, as the front end infers them."""
    conds: list[tuple[Lin, int]] = []
    if s.tensor in shapes:
        conds += [(Lin(((v, 1),)), e) for v, e in zip(s.indices, shapes[s.tensor], strict=False)]
    for r in reads(s.rhs):
        conds += _conditions(r.tensor, r.subs, shapes)
    variables = list(s.indices) + sorted(index_vars(s.rhs) - set(s.indices) - set(sizes))
    solved = {v: (lo.value(sizes), hi.value(sizes)) for v, lo, hi in s.where}
    while True:
        found = {}
        for v in variables:
            if v in solved:
                continue
            lows, highs = [], []
            for lin, extent in conds:
                a = dict(lin.terms).get(v, 0)
                others = [u for u, _ in lin.terms if u != v]
                if a == 0 or any(u not in solved for u in others):
                    continue
                rmin, rmax = _extremes(lin, solved, skip=v)
                if a > 0:
                    lows.append(-(rmin // a)), highs.append((extent - 1 - rmax) // a + 1)
                else:
                    lows.append(-((extent - 1 - rmax) // -a)), highs.append(rmin // -a + 1)
            if lows:
                found[v] = (max(lows), min(highs))
        if not found:
            break
        solved.update(found)
    missing = [v for v in variables if v not in solved]
    if missing:
        raise Invalid(f"unbounded index {missing}")
    for v in variables:
        if solved[v][1] <= solved[v][0]:
            raise Invalid(f"empty range of {v}")
    return {v: solved[v] for v in variables}


def _conditions(
    tensor: str, subs: tuple[Sub, ...], shapes: dict[str, tuple[int, ...]]
) -> list[tuple[Lin, int]]:
    if tensor not in shapes:
        raise Invalid(f"{tensor} is read before it is written")
    if len(subs) != len(shapes[tensor]):
        raise Invalid(f"{tensor} read with the wrong rank")
    out = []
    for sub, extent in zip(subs, shapes[tensor], strict=True):
        if isinstance(sub, Gather):
            out += _conditions(sub.tensor, sub.subs, shapes)
        elif sub.terms:
            out.append((sub, extent))
    return out


def _extremes(lin: Lin, ranges: dict[str, tuple[int, int]], skip: str = "") -> tuple[int, int]:
    lo = hi = lin.const
    for u, c in lin.terms:
        if u == skip:
            continue
        first, last = ranges[u][0], ranges[u][1] - 1
        lo += first * c if c > 0 else last * c
        hi += last * c if c > 0 else first * c
    return lo, hi


def _check_subscripts(s: Stmt, ranges: dict[str, tuple[int, int]], info: Info) -> None:
    """Every subscript in bounds over the whole box; gathers remember their extents."""

    def visit(tensor: str, subs: tuple[Sub, ...]) -> None:
        for sub, extent in zip(subs, info.shapes[tensor], strict=True):
            if isinstance(sub, Gather):
                old = info.gather_extent.get(sub.tensor, extent)
                info.gather_extent[sub.tensor] = min(old, extent)
                visit(sub.tensor, sub.subs)
                continue
            lo, hi = _extremes(sub, ranges)
            if lo < 0 or hi >= extent:
                raise Invalid(f"{tensor} subscript {sub.render()} out of bounds")

    if s.tensor in info.shapes:
        if len(s.indices) != len(info.shapes[s.tensor]):
            raise Invalid(f"{s.tensor} written with the wrong rank")
        visit(s.tensor, tuple(Lin(((v, 1),)) for v in s.indices))
    for r in reads(s.rhs):
        if r.tensor == s.tensor and (
            s.op != "=" or r.subs != tuple(Lin(((v, 1),)) for v in s.indices)
        ):
            raise Invalid(f"{s.tensor} reads itself")
        visit(r.tensor, r.subs)


def type_of(e: Expr, types: dict[str, str]) -> str:
    match e:
        case Num(ty=ty) | Cast(ty=ty):
            return ty
        case Var():
            return INT
        case Read(tensor=t):
            return types[t]
        case Call(fn=fn) if fn not in ("min", "max"):
            return FLOAT
        case Cond(then=t, orelse=o):
            return _promote(type_of(t, types), type_of(o, types))
    kids = [type_of(c, types) for c in children(e)]
    return FLOAT if FLOAT in kids else INT


def _promote(a: str, b: str) -> str:
    return FLOAT if FLOAT in (a, b) else INT


def bound(e: Expr, env: dict[str, tuple[int, int]], tensors: dict[str, int]) -> int:
    """A bound on |value| of `e` (every node checked against LIMIT)."""
    kids = [bound(c, env, tensors) for c in children(e)]
    match e:
        case Num(value=v):
            b = abs(v)
        case Var(name=n):
            b = max(abs(env[n][0]), abs(env[n][1] - 1))
        case Read(tensor=t):
            b = tensors[t]
        case Bin(op="+" | "-"):
            b = kids[0] + kids[1]
        case Bin(op="*"):
            b = kids[0] * kids[1]
        case Bin(op="/"):
            b = kids[0]
        case Bin(op="%"):
            b = min(kids[0], kids[1])
        case Call(fn="pow"):
            b = kids[0] ** 2
        case Call(fn="fma"):
            b = kids[0] * kids[1] + kids[2]
        case Cond():
            b = max(kids[2], kids[3])
        case _:
            b = max(kids)
    if b >= LIMIT:
        raise Invalid(f"a value may reach {b}")
    return b
