"""Expressions of generated code: the typed TC expressions of statement bodies (isl's
AST expressions are in `tcpy.codegen.isl_exprs`).

Index arithmetic is 64-bit. TC values keep TC's types: an index or a size used as a
value is int32, arithmetic is carried out in the type sema assigned (float16 in
float32), integer `/` and `%` go through helpers that report a zero divisor instead of
trapping, and a subscript that range inference did not prove in bounds (a gather, a
`%`, a read under a condition) goes through a helper that reports it out of range.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tcpy.codegen import halves, vector_math
from tcpy.codegen.dialect import Dialect
from tcpy.codegen.isl_exprs import sym_expr
from tcpy.errors import InternalError
from tcpy.mapping.marks import innermost_first
from tcpy.naming import extent_name, size_name, tensor_name
from tcpy.parser import ast
from tcpy.parser.checked import CheckedDef, CheckedStatement
from tcpy.parser.linear import linear_form
from tcpy.parser.printer import expr_text
from tcpy.parser.ranges import guarded_accesses, known_conditions, stays_within
from tcpy.parser.symbolic import Sym
from tcpy.types import ScalarType, promote

# --- statement bodies ---------------------------------------------------------------------


@dataclass
class Helpers:
    """The helper functions a translation unit needs, collected while printing."""

    divisions: set[ScalarType] = field(default_factory=set)  # integer types divided
    extrema: set[ScalarType] = field(default_factory=set)  # types of min/max
    numeric_extrema: set[ScalarType] = field(default_factory=set)  # of fmin/fmax (C)
    checked_index: bool = False
    builtins: set[str] = field(default_factory=set)  # C function names used
    own: frozenset[str] = vector_math.OWN  # math functions whose float32 calls are tcpy's


@dataclass(frozen=True, slots=True)
class LocalCopy:
    """A tile of a tensor copied into a local buffer (`tcpy.codegen.pack`): the
    statements printed inside the copy's scope read the tensor from there."""

    buffer: str
    offsets: tuple[str, ...]  # the tile's first element, per dimension, in C
    sizes: tuple[int, ...]  # the buffer's extents, per dimension of the tensor
    turns: int = 0  # how many of the tile's innermost dimensions the buffer holds first
    base: str = ""  # where the tile starts in the buffer (a stage of a ring), in C
    phases: int = 1  # the innermost dimension held in phases (`marks.Pack.phased`)

    def index(self, d: Dialect, subscripts: list[str], held: str | None = None) -> str:
        """The buffer's offset of the tensor's element at `subscripts`; `held`, where the
        buffer holds the innermost one (`phased`), if not at its position in the tile."""
        local = [f"({s}) - {o}" for s, o in zip(subscripts, self.offsets, strict=True)]
        if held is not None:
            local[-1] = held
        flat = self.place(d, local)
        return f"{self.base} + {flat}" if self.base else flat

    def place(self, d: Dialect, local: list[str]) -> str:
        """The buffer's offset, from the tile's start, of the element at `local`, its
        place in the tile per dimension of the tensor."""
        extents = [str(n) for n in self.sizes]
        if self.turns:
            local = innermost_first(local, self.turns)
            extents = innermost_first(extents, self.turns)
        return flat_index(d, local, extents)


@dataclass(frozen=True)
class Read:
    """A load a statement's body prints: the load (`form` of the dialect, on `array`
    at the flat `index`, as `text`), the isl ids its index uses (loop iterators,
    block and thread parameters), whether a run-time check guards its subscripts
    (`tc_index`) or its subscripts compute more than an affine form (`plain` False),
    whether it lies in another read's subscripts (`nested`: a gather's index) or has
    reads in its own (`gathers`), whether the body reads it into a local first
    (`hoisted`, `BodyPrinter.hoist_loads`), and the extent it is checked against
    where it is, whole, a subscript checked on the data (`bound`)."""

    text: str
    form: str  # "load", "readonly_load" or "copy_load"
    array: str
    index: str
    ids: frozenset[str]
    checked: bool
    plain: bool
    nested: bool
    gathers: bool
    hoisted: bool = False
    within: int | None = None  # the position in `StatementParts.reads` of the read around it
    bound: str | None = None  # `tc_index(<this read>, bound, tc_status)`: a subscript read always


class CheckedLocal(str):
    """A substitute for a read (`BodyPrinter.parts`) that is a subscript checked on
    the data (`Read.bound`): a local holding its value already checked
    (`checked_load`), which the subscript then uses as it is."""


def checked_load(read: Read) -> str:
    """The value of `read`, a subscript checked on the data, with its check: the
    value a `CheckedLocal` holds."""
    return f"tc_index({read.text}, {read.bound}, tc_status)"


def local_for(read: Read, reads: Sequence[Read], name: str) -> str:
    """The local `name` that `read` is loaded into before a loop: a `CheckedLocal`
    where every load of its element among `reads` is, whole, a subscript checked
    against one extent (its value used elsewhere keeps its own type)."""
    same = [r.bound for r in reads if r.text == read.text]
    return CheckedLocal(name) if read.bound is not None and set(same) == {read.bound} else name


@dataclass
class BodyPrinter:
    """Prints the bodies of one definition's statements."""

    cdef: CheckedDef
    dialect: Dialect
    helpers: Helpers
    readonly: frozenset[str] = frozenset()  # tensors read through the read-only cache
    hoist_loads: bool = False
    """Read an element a statement reads several times (unconditionally) once, into a
    local declared before it (CUDA: the emulator counts what the source asks for, and
    no load then depends on the compiler's aliasing analysis)."""
    copies: Mapping[str, LocalCopy] = field(default_factory=dict)  # by tensor
    sizes: Mapping[str, int] | None = None  # the sizes the kernel is built for, if fixed

    def statement(
        self,
        st: CheckedStatement,
        init: bool,
        indices: Mapping[str, str],
        substitute: Mapping[str, str] | None = None,
    ) -> str:
        """One statement instance in C; `indices` maps each TC index to its value, and
        `substitute` a load's text to what is printed in its place (`parts`)."""
        parts = self.parts(st, indices, init, substitute=substitute)
        if init:
            return f"{parts.target} = {parts.store(parts.identity)};"
        value = parts.value
        if parts.reduction is not None:
            value = parts.combine(parts.current)
        return parts.wrap(f"{parts.target} = {parts.store(value)};")

    def parts(
        self,
        st: CheckedStatement,
        indices: Mapping[str, str],
        init: bool = False,
        ids: Mapping[str, frozenset[str]] | None = None,
        substitute: Mapping[str, str] | None = None,
    ) -> StatementParts:
        """The pieces of a statement instance (of its initialisation when `init`: the
        right-hand side, which uses the reduction indices, is then left out). `ids`:
        the isl ids each TC index's value uses (for `StatementParts.reads`);
        `substitute`: a load's text (`Read.text`) -> what is printed in its place (a
        local the printer loaded it into)."""
        ctx = _Context(self, st, indices, ids or {}, substitute or {})
        tensor = self.cdef.tensor(st.tensor)
        subscripts = ctx.places(st) if st.scatter else [indices[v] for v in st.indices]
        compute = tensor.scalar.compute
        copy = self.copies.get(st.tensor)
        if copy is None:
            array, lhs = tensor_name(st.tensor), ctx.flat(st.tensor, subscripts)
            target = self.dialect.store.format(array=array, index=lhs)
            current = self.dialect.load.format(array=array, index=lhs)
        else:  # a temporary kept in a local array (`scratch:` on the GPU)
            array, lhs = copy.buffer, copy.index(self.dialect, subscripts)
            target = self.dialect.copy_store.format(array=array, index=lhs)
            current = self.dialect.copy_load.format(array=array, index=lhs)
        reduction = st.op.reduction
        identity = "" if reduction is None else _literal(reduction.neutral(tensor.scalar), compute)
        # a half element copied as it is (rounding what a load widened gives it back)
        bits = reduction is None and tensor.scalar.is_half and _read_of(st.rhs, tensor.scalar)
        value = "" if init else ctx.expr(st.rhs, tensor.scalar if bits else compute)
        stored = tensor.scalar if bits else compute
        exact = not bits and reduction in _EXACT_REDUCTIONS and halves.exact(st.rhs, tensor.scalar)

        def merge(a: str, b: str) -> str:
            return b if reduction is None else ctx.combine(reduction, a, b, compute)

        return StatementParts(
            target=target,
            array=array,
            element=lhs,
            in_copy=copy is not None,
            address=self.dialect.address.format(array=array, index=lhs),
            current=_convert(current, tensor.scalar, compute, self.dialect),
            value=value,
            identity=identity,
            reduction=reduction,
            compute=self.dialect.ctype(compute),
            storage=self.dialect.ctype(tensor.scalar),
            floating=compute.is_float,
            itemsize=compute.dtype.itemsize,
            combine=lambda current: merge(current, value),
            merge=merge,
            prelude=tuple(ctx.prelude),
            reads=tuple(ctx.reads),
            conditional=_conditional(st.rhs),
            stored=self._storing(stored, tensor.scalar, exact),
        )

    def _storing(self, have: ScalarType, want: ScalarType, exact: bool) -> Callable[[str], str]:
        """How a value of type `have` is stored into a tensor of type `want`: rounded to
        a half type, or, on the CPU, taken as it is where it is `exact`ly one of that
        type's values already."""
        helper = halves.exact_from_float(want) if self.dialect.name == "c" and exact else None
        if helper is not None:
            return functools.partial(_call, helper)
        return functools.partial(_convert, have=have, want=want, dialect=self.dialect)


@dataclass
class StatementParts:
    """The pieces of a statement, for printers that rearrange them (register
    promotion of an accumulator keeps `current` in a local across a loop)."""

    target: str  # the element written, as an lvalue
    array: str  # the array of that element (the tensor's, or a copy's)
    element: str  # its flat index there
    in_copy: bool  # the element lies in a copy (shared or local), not in the tensor
    address: str  # the element's address
    current: str  # its value in the compute type
    value: str  # the right-hand side in the compute type
    identity: str  # the reduction's identity ("" for `=`)
    reduction: ast.Reduction | None
    compute: str  # C type of the computation
    storage: str  # C type of the tensor
    floating: bool  # whether the computation is in floating point
    itemsize: int  # bytes of a value of the compute type
    combine: Callable[[str], str]  # accumulator -> combined value
    merge: Callable[[str, str], str]  # two partial results -> their combination
    prelude: tuple[str, ...] = ()  # declarations `value` uses (`BodyPrinter.hoist_loads`)
    reads: tuple[Read, ...] = ()  # the loads of `value` (and `prelude`), in print order
    conditional: bool = False  # `value` evaluates some part only under a condition
    stored: Callable[[str], str] = str  # a compute-type value -> the storage type's

    def wrap(self, line: str) -> str:
        """A line that uses `value`, in a scope with the declarations it needs."""
        return f"{{ {' '.join(self.prelude)} {line} }}" if self.prelude else line

    def store(self, value: str) -> str:
        """`value`, of the compute type, as stored (rounded to a half type)."""
        return self.stored(value)


class _Context:
    """Printing state for one statement: its index values and unproved accesses."""

    def __init__(
        self,
        printer: BodyPrinter,
        st: CheckedStatement,
        indices: Mapping[str, str],
        ids: Mapping[str, frozenset[str]],
        substitute: Mapping[str, str],
    ):
        self.p = printer
        self.st = st
        self.indices = indices
        self.ids = ids
        self.substitute = substitute
        self.reads: list[Read] = []  # the loads printed, in order
        self.depth = 0  # the reads open around the one being printed (gathers)
        accesses = list(guarded_accesses(st.rhs))
        self.unproved = {id(a) for a, guarded in accesses if guarded}
        self.known = known_conditions(st.rhs)  # what holds where a guarded access is read
        texts = Counter(expr_text(a) for a, guarded in accesses if not guarded)
        self.repeated = {t for t, n in texts.items() if n > 1} if printer.hoist_loads else set()
        self.loaded: dict[str, str] = {}  # access text -> the local holding its value
        self.prelude: list[str] = []  # the declarations of those locals

    @property
    def d(self) -> Dialect:
        return self.p.dialect

    def flat(self, tensor: str, subscripts: list[str]) -> str:
        extents = [extent_name(tensor, k) for k in range(len(subscripts))]
        return flat_index(self.d, subscripts, extents)

    def expr(self, e: ast.Expr, want: ScalarType) -> str:
        """`e` converted to the compute type `want` (a read of a half tensor: as stored,
        where `want` is its type)."""
        assert e.ty is not None
        if isinstance(e, ast.Access) and want.is_half:
            return self.access(e, widened=False)
        return _convert(self.value(e), e.ty.compute, want, self.d)

    def value(self, e: ast.Expr) -> str:
        """`e` in its own compute type."""
        assert e.ty is not None
        ty = e.ty.compute
        match e:
            case ast.IntLit(value=v):
                return str(v)
            case ast.FloatLit(value=v):
                return _literal(v, ty)
            case ast.Index(name=n):
                return f"(({self.d.ctype(ScalarType.INT32)})({self.indices[n]}))"
            case ast.SizeRef(name=n):
                return f"(({self.d.ctype(ScalarType.INT32)}){size_name(n)})"
            case ast.Access():
                return self.access(e)
            case ast.Cast(to=to, value=v):
                inner = self.value(v)
                assert v.ty is not None
                if to.is_half:  # rounded to `to`, computed on in float32
                    return _convert(_convert(inner, v.ty.compute, to, self.d), to, ty, self.d)
                return _convert(inner, v.ty.compute, ty, self.d)
            case ast.Call(name="fmin" | "fmax" as name, args=args) if (
                self.d.name == "c" and ty.is_float
            ):
                # libm's fminf and fmaxf are calls GCC does not vectorise (an MLP's
                # ReLU, `fmax(x, 0)`, took a quarter of the layer's time)
                self.p.helpers.numeric_extrema.add(ty)
                a, b = (self.expr(a, ty) for a in args)
                return f"{numeric_extremum_helper(name == 'fmin', ty)}({a}, {b})"
            case ast.Call(name=name, args=args):
                fn = name + ("f" if ty is ScalarType.FLOAT32 else "")
                if self.d.name == "c" and ty is ScalarType.FLOAT32 and name in self.p.helpers.own:
                    fn = vector_math.c_name(name)  # tcpy's own, inline and vectorisable
                self.p.helpers.builtins.add(fn)
                return f"{fn}({', '.join(self.expr(a, ty) for a in args)})"
            case ast.Unary(op=ast.UnaryOp.NOT, operand=v):
                return f"(!{self.value(v)})"
            case ast.Unary(op=ast.UnaryOp.NEG, operand=v):
                return f"(-{self.expr(v, ty)})"
            case ast.Binary():
                return self.binary(e)
            case ast.Ternary(cond=c, then=t, orelse=o):
                return f"({self.value(c)} ? {self.expr(t, ty)} : {self.expr(o, ty)})"
        raise InternalError(f"unexpected expression {type(e).__name__}")

    def binary(self, e: ast.Binary) -> str:
        assert e.ty is not None and e.lhs.ty is not None and e.rhs.ty is not None
        op = e.op
        if op.is_logical:
            return f"({self.value(e.lhs)} {op.value} {self.value(e.rhs)})"
        if op.is_comparison:
            common = promote(e.lhs.ty, e.rhs.ty).compute
            return f"({self.expr(e.lhs, common)} {op.value} {self.expr(e.rhs, common)})"
        ty = e.ty.compute
        a, b = self.expr(e.lhs, ty), self.expr(e.rhs, ty)
        if op in (ast.BinaryOp.DIV, ast.BinaryOp.MOD) and ty.is_integer:
            if isinstance(e.rhs, ast.IntLit) and e.rhs.value not in (0, -1):
                return f"({a} {op.value} {b})"  # no zero, no overflow: C's, vectorised
            self.p.helpers.divisions.add(ty)
            fn = "div" if op is ast.BinaryOp.DIV else "mod"
            return f"tc_{fn}_{ty.value}({a}, {b}, tc_status)"
        if op in (ast.BinaryOp.MIN, ast.BinaryOp.MAX):
            return _extremum(op is ast.BinaryOp.MIN, a, b, ty, self.p.helpers)
        return f"({a} {op.value} {b})"

    def subscript(self, e: ast.Expr) -> str:
        """An affine subscript in 64-bit arithmetic (`access`)."""
        match e:
            case ast.Index(name=n):
                return f"({self.indices[n]})"  # a loop value may be a sum (`c3 + c13`)
            case ast.IntLit(value=v):
                return str(v)
            case ast.SizeRef(name=n):
                return size_name(n)
            case ast.Unary(op=ast.UnaryOp.NEG, operand=v):
                return f"(-{self.subscript(v)})"
            case ast.Binary(op=op, lhs=a, rhs=b) if op in _AFFINE:
                return f"({self.subscript(a)} {op.value} {self.subscript(b)})"
        return f"(({self.d.index_type})({self.value(e)}))"

    def places(self, st: CheckedStatement) -> list[str]:
        """The subscripts of the element a scatter-add writes, each one not affine
        checked on the data (`tc_index`) as a gathered read's is."""
        self.depth += 1
        texts = [self.place(st.tensor, k, arg, True) for k, arg in enumerate(st.scatter)]
        self.depth -= 1
        return [text for text, _ in texts]

    def place(
        self, tensor: str, k: int, arg: ast.Expr, proven: bool, known: Sequence[ast.Expr] = ()
    ) -> tuple[str, bool]:
        """Subscript `k` of an access of `tensor`, and whether it is checked on the data:
        `proven` says range inference proved it in bounds where it is affine (False:
        the access is read under a condition); `known` holds where it is read."""
        unconditional = proven
        if not proven and self.depth == 1:  # read under a condition: proven at any rate?
            extent = self.p.cdef.tensor(tensor).shape[k]
            proven = stays_within(arg, self.st.ranges, extent, self.p.sizes, known)
        proven = proven and linear_form(arg) is not None
        # an affine subscript proven in bounds is computed in 64 bits, from the
        # loop values as they are: `(int32_t)` casts inside it (TC's type for an
        # index used as a value) hide from the C compiler that `w + kw` moves by
        # one with the loop, and a loop with sizes known only at run time then
        # gathers instead of loading a vector (a generic conv2d: 6x slower); CUDA
        # keeps its 32-bit arithmetic
        if isinstance(arg, ast.Index):  # a plain index: the loop value as it is
            text = self.indices[arg.name]
        elif proven and self.d.name == "c":
            text = self.subscript(arg)
        else:
            text = self.value(arg)
        if proven:
            return text, False
        bound = extent_name(tensor, k)
        self.p.helpers.checked_index = True
        if isinstance(arg, ast.Access) and unconditional:  # a gather's index: the last read
            self.reads[-1] = dataclasses.replace(self.reads[-1], bound=bound)
            if isinstance(self.substitute.get(self.reads[-1].text), CheckedLocal):
                return text, True
        return f"tc_index({text}, {bound}, tc_status)", True

    def access(self, e: ast.Access, widened: bool = True) -> str:
        """The value of the read `e` in its compute type (`widened`), else as stored."""
        info = self.p.cdef.tensor(e.tensor)
        subscripts = []
        checked = False
        first_inner = len(self.reads)
        self.depth += 1
        for k, arg in enumerate(e.args):
            known = self.known.get(id(e), ())
            text, check = self.place(e.tensor, k, arg, id(e) not in self.unproved, known)
            checked = checked or check
            subscripts.append(text)
        self.depth -= 1
        copy = self.p.copies.get(e.tensor)
        if copy is not None and not checked:
            # proven in the tensor and in the tile, so in what was copied
            held = self.phased(e.args[-1], copy) if copy.phases > 1 else None
            form, array, index = "copy_load", copy.buffer, copy.index(self.d, subscripts, held)
        else:
            readonly = e.tensor in self.p.readonly and not info.scalar.is_bool  # no __ldg for bool
            form = "readonly_load" if readonly else "load"
            array, index = tensor_name(e.tensor), self.flat(e.tensor, subscripts)
        load = getattr(self.d, form).format(array=array, index=index)
        text = expr_text(e)
        hoisted = text in self.repeated and id(e) not in self.unproved
        inner = self.reads[first_inner:]
        here = len(self.reads)
        for k in range(first_inner, here):  # the reads this one's subscripts make
            if self.reads[k].within is None:
                self.reads[k] = dataclasses.replace(self.reads[k], within=here)
        self.reads.append(Read(
            load, form, array, index, self._uses(e).union(*(r.ids for r in inner)), checked,
            all(linear_form(a) is not None for a in e.args), self.depth > 0, bool(inner), hoisted,
        ))  # fmt: skip
        value = self.substitute.get(load, load)
        if not widened:
            return value
        value = _convert(value, info.scalar, info.scalar.compute, self.d)
        if not hoisted:
            return value
        if text not in self.loaded:  # read once, before the statement
            self.loaded[text] = name = f"tc_v{len(self.loaded)}"
            self.prelude.append(f"const {self.d.ctype(info.scalar.compute)} {name} = {value};")
        return self.loaded[text]

    def phased(self, arg: ast.Expr, copy: LocalCopy) -> str:
        """Where a buffer held in phases (`LocalCopy.phases`) holds the element at the
        innermost subscript `arg`, an affine form: its phase's start, then its step in
        the phase. The terms whose coefficients are multiples of the phases (the vector
        loop's, by the mapping's choice) move it along its phase, one step for each
        multiple; the rest, a value the vector loop does not change, pick the phase."""
        form = linear_form(arg)
        if form is None:
            raise InternalError(f"a phased copy read at a subscript not affine: {arg}")
        phases = copy.phases

        def term(n: str, c: int) -> str:
            return f"({self.indices[n]})" if c == 1 else f"{c} * ({self.indices[n]})"

        steps = [term(n, c // phases) for n, c in form.coeffs if c % phases == 0]
        rest = [term(n, c) for n, c in form.coeffs if c % phases != 0]
        constant = [] if form.rest == Sym() else [f"({sym_expr(form.rest)})"]
        rest_text = " + ".join([*rest, *constant, f"-{copy.offsets[-1]}"])
        start = f"tc_floord({rest_text}, {phases})"
        phase = f"({rest_text} - {phases} * {start})"
        return " + ".join([f"{phase} * {copy.sizes[-1] // phases}", start, *steps])

    def _uses(self, e: ast.Access) -> frozenset[str]:
        """The isl ids the values of the indices in `e`'s subscripts use."""
        names = {n.name for a in e.args for n in ast.walk(a) if isinstance(n, ast.Index)}
        return frozenset().union(*(self.ids.get(n, frozenset()) for n in names))

    def combine(self, reduction: ast.Reduction, current: str, value: str, ty: ScalarType) -> str:
        match reduction:
            case ast.Reduction.SUM:
                return f"{current} + {value}"
            case ast.Reduction.PROD:
                return f"{current} * {value}"
            case ast.Reduction.MIN | ast.Reduction.MAX:
                return _extremum(reduction is ast.Reduction.MIN, current, value, ty, self.p.helpers)
        raise InternalError(str(reduction))


def _conditional(e: ast.Expr) -> bool:
    """Whether `e` evaluates some part only under a condition (`?:`, `&&`, `||`)."""
    return any(
        isinstance(n, ast.Ternary) or (isinstance(n, ast.Binary) and n.op.is_logical)
        for n in ast.walk(e)
    )


def flat_index(d: Dialect, subscripts: list[str], extents: list[str]) -> str:
    """The row-major offset of an element of an array of these extents."""
    if not subscripts:
        return "0"
    out = f"({d.index_type})({subscripts[0]})"
    for sub, extent in zip(subscripts[1:], extents[1:], strict=True):
        out = f"({out} * {extent} + ({sub}))"
    return out


_AFFINE = (ast.BinaryOp.ADD, ast.BinaryOp.SUB, ast.BinaryOp.MUL)


def _extremum(smallest: bool, a: str, b: str, ty: ScalarType, helpers: Helpers) -> str:
    """min/max through an inline helper made of a comparison (vectorisable, unlike a
    call of fminf; and each operand appears once, where a ternary in place would
    repeat both and nested min/max would grow exponentially). On floats the helper
    propagates NaN, as TC's min and max do on every target (C's and CUDA's fminf
    return the other operand instead)."""
    helpers.extrema.add(ty)
    return f"{extremum_helper(smallest, ty)}({a}, {b})"


def extremum_helper(smallest: bool, ty: ScalarType) -> str:
    return f"tc_{'min' if smallest else 'max'}_{ty.value}"


def numeric_extremum_helper(smallest: bool, ty: ScalarType) -> str:
    """The inline helper printed for C's `fmin` or `fmax` (`c_helpers`)."""
    return f"tc_f{'min' if smallest else 'max'}_{ty.value}"


# reductions whose result is one of the values reduced (or the identity, an infinity)
_EXACT_REDUCTIONS = (None, ast.Reduction.MIN, ast.Reduction.MAX)


def _call(fn: str, value: str) -> str:
    return f"{fn}({value})"


def _read_of(e: ast.Expr, ty: ScalarType) -> bool:
    """Whether `e` is a read of a tensor of type `ty` and nothing more."""
    return isinstance(e, ast.Access) and e.ty is ty


def _convert(text: str, have: ScalarType, want: ScalarType, dialect: Dialect) -> str:
    """`text`, a value of type `have` (a half type: as stored), as a value of `want`
    (a half type: rounded for storing, `tcpy.codegen.halves`)."""
    if have is want:
        return text
    if have.is_half:
        return _convert(f"{halves.to_float(have)}({text})", ScalarType.FLOAT32, want, dialect)
    if want.is_half:
        return f"{halves.from_float(want)}({_convert(text, have, ScalarType.FLOAT32, dialect)})"
    return f"(({dialect.ctype(want)}){text})"


def _literal(value: float | int | bool, ty: ScalarType) -> str:
    if ty.is_bool:
        return "1" if value else "0"
    if ty.is_float:
        if not np.isfinite(value):  # C has no literal for them; every compiler folds these
            f = "" if ty is ScalarType.FLOAT64 else "f"
            if np.isnan(value):
                return f"(0.0{f} / 0.0{f})"
            return f"({'-' if value < 0 else ''}1.0{f} / 0.0{f})"
        if ty is ScalarType.FLOAT64:
            return repr(float(value))
        text = str(np.float32(value))
        if "e" not in text and "." not in text:
            text += ".0"
        return text + "f"
    v = int(value)
    if v in (-(2**31), -(2**63)):  # the literal of the magnitude would overflow
        return f"({v + 1}{'LL' if v < -(2**31) else ''} - 1)"
    suffix = "ULL" if v > 2**63 - 1 else ("LL" if abs(v) > 2**31 - 1 else "")
    return f"{v}{suffix}"
