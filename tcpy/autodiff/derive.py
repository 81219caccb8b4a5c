"""The backward of a def, derived in reverse mode, as TC text (`gradient`).

The backward is one def, `<name>_grad`. Its inputs: the forward's inputs, the forward's
outputs it reads, then `d_<output>` for every output. Its outputs: `d_<input>` for each
input differentiated (`wrt`, by default every float input), in the forward's order.
It recomputes the temporaries (and the versions of tensors written more than once,
`tcpy.autodiff.versions`) it reads, or takes them as inputs where they are saved
(`save`), then walks the statements backwards, adding the
adjoint of each read to its tensor's (`tcpy.autodiff.solve` says where), through the
reduction's rule:

- `=`, `+=!`, `+=`: the chain rule (`tcpy.autodiff.rules`);
- `max=!`, `min=!`: to the instances equal to the result, split evenly among ties;
- `*=!`: the product of the others, exact with zeros (one zero: only it gets a
  gradient; two or more: none).

Where a solved index must be kept in its forward range (a convolution's input
gradient: `h = y - kh` within `0:H-KH+1`) and only one factor of the adjoint reads at
it, that factor is read from a copy padded with zeros (`_padded`), so the sum needs no
guard: a guarded sum is a conditional per instance, which compilers neither vectorise
nor bound (the convolution's input gradient ran 9 times slower than the padded one).

Saved values (`save`, `tcpy.autodiff.saving`) are inputs of the backward, after the
forward's outputs it reads; `forward_saving` gives the forward that returns them beside
its outputs. The rules of max, min and product are `tcpy.autodiff.extrema`'s; the text
of the backward, its recomputed statements and its signature, `tcpy.autodiff.writer`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tcpy.autodiff import build as b
from tcpy.autodiff import text
from tcpy.autodiff.extrema import extremum, product
from tcpy.autodiff.invariance import invariant
from tcpy.autodiff.rules import read_adjoints
from tcpy.autodiff.saving import Save, savable
from tcpy.autodiff.solve import Solved, solve
from tcpy.autodiff.versions import Version, covers, fresh
from tcpy.autodiff.writer import Writer
from tcpy.errors import TCGradientError
from tcpy.parser import ast, check_source
from tcpy.parser.checked import CheckedDef, CheckedStatement, IndexRange
from tcpy.parser.ranges import affine_span, guarded_accesses
from tcpy.parser.symbolic import Sym, provably_positive
from tcpy.types import ScalarType

A = ast.AssignOp
Reduction = ast.Reduction


@dataclass(frozen=True)
class Derived:
    """A def's backward (`backward`, TC text), the forward's values it takes as inputs
    (`saved`, in the order it takes them), and the forward that returns them after its
    outputs (`forward`, TC text of `<name>_saving`; None when nothing is saved)."""

    backward: str
    saved: tuple[str, ...]
    forward: str | None


def gradient(
    source: str,
    name: str,
    wrt: Sequence[str] | None = None,
    filename: str | None = None,
    save: Save = None,
) -> str:
    """The backward of def `name` of `source` as TC text (see the module): a def
    `<name>_grad` that the engine compiles, fuses and tunes as any other, and that a
    user may read, edit and pass back as a hand-written backward. `wrt`: the inputs
    to differentiate (default: every float input); `filename`: for errors; `save`:
    the forward's values it takes as inputs (default none: it recomputes them; the
    forward that returns them is `forward_saving`'s)."""
    return derive(source, name, wrt, filename, save).backward


def forward_saving(
    source: str,
    name: str,
    wrt: Sequence[str] | None = None,
    filename: str | None = None,
    save: Save = "auto",
) -> str | None:
    """The forward of def `name` that also returns what `gradient(..., save=save)`
    takes as saved inputs, after its outputs, in that order: TC text of a def
    `<name>_saving`; None when that backward saves nothing."""
    return derive(source, name, wrt, filename, save).forward


def derive(
    source: str,
    name: str,
    wrt: Sequence[str] | None = None,
    filename: str | None = None,
    save: Save = None,
) -> Derived:
    """The backward of def `name` of `source`, what it saves, and the forward that
    returns it (the arguments as `gradient`'s)."""
    defs = check_source(source, filename)
    if name not in defs:
        known = ", ".join(defs) or "none"
        raise TCGradientError(f"no def named {name!r} in the source (defs: {known})")
    cdef = defs[name]
    try:
        return _Backward(cdef, wrt=_wrt(cdef, wrt), save=save).derived()
    except TCGradientError as e:
        raise cdef.located(e) from None


def _wrt(cdef: CheckedDef, wrt: Sequence[str] | None) -> list[str]:
    """The inputs to differentiate, in the forward's order."""
    floats = [t.name for t in cdef.inputs if t.scalar.is_float]
    if wrt is None:
        if not floats:
            raise TCGradientError(f"def {cdef.name} has no float input to differentiate", cdef.span)
        return floats
    for n in wrt:
        if n not in {t.name for t in cdef.inputs}:
            raise TCGradientError(f"wrt names {n!r}, which is no input of {cdef.name}", cdef.span)
        if n not in floats:
            ty = cdef.tensor(n).scalar.value
            raise TCGradientError(
                f"wrt names {n}, a {ty} input: only floats have gradients", cdef.span
            )
    if not wrt:
        raise TCGradientError(f"wrt names no input of {cdef.name} to differentiate", cdef.span)
    return [n for n in floats if n in wrt]


@dataclass(kw_only=True)
class _Backward(Writer):
    """The backward of `cdef` being built: its statements, adjoint by adjoint."""

    wrt: list[str]
    save: Save = None
    adjoint: dict[str, str] = field(default_factory=dict)  # version name -> its adjoint's
    started: set[str] = field(default_factory=set)  # adjoints with a statement already

    def __post_init__(self) -> None:
        super().__post_init__()
        self.relevant = self._relevant()
        self.nonzero = self._nonzero()
        # the versions taken as inputs where the backward reads them
        self.savable = savable(self.cdef, self.versions, self.save)

    # --- which versions matter --------------------------------------------------------

    def _relevant(self) -> set[str]:
        """The versions that depend on an input differentiated."""
        vs = self.versions
        out = set(self.wrt)
        for s in range(len(vs.written)):
            reads = {v.name for v in vs.reads(s)}
            if reads & out or (vs.keeps[s] and vs.before[s].name in out):
                out.add(vs.written[s].name)
        return out

    def _nonzero(self) -> set[str]:
        """The versions whose adjoints may be nonzero: the outputs, and what they read,
        but for the versions no output depends on (`tcpy.autodiff.invariance`: a
        softmax's row maximum)."""
        vs = self.versions
        out = {vs.last(t.name).name for t in self.cdef.outputs if t.scalar.is_float}
        for s in reversed(range(len(vs.written))):
            if vs.written[s].name in out:
                out |= {v.name for v in vs.reads(s)}
                if vs.keeps[s] and not vs.before[s].zeros:
                    out.add(vs.before[s].name)
        return {n for n in out if n not in vs.of or not invariant(vs, vs.of[n])}

    def needs(self, v: Version) -> bool:
        return v.name in self.relevant and v.name in self.nonzero

    # --- the adjoint statements ---------------------------------------------------------

    def derived(self) -> Derived:
        vs = self.versions
        for s in reversed(range(len(vs.written))):
            if self.needs(vs.written[s]):
                self._statement(s)
        for n in self.wrt:
            if n not in self.started:
                t = self.cdef.tensor(n)
                dims = self.dims(len(t.shape))
                self.emit(self._name_of(n), dims, A.ASSIGN, b.num(0, t.span), self.whole(t, dims))
        self.merge_sums()
        self.reuse_values()
        self.inline_once({f"d_{n}" for n in self.wrt})
        backward, saved = self.backward(self.wrt, self.savable)
        return Derived(backward, saved, self.forward(saved) if saved else None)

    def _statement(self, s: int) -> None:
        """The adjoints of the reads of statement `s` (its written version needs one)."""
        vs = self.versions
        st, w = self.cdef.statements[s], vs.written[s]
        grad = self._read_adjoint(w)
        if grad is None:  # nothing later depends on it through a gradient
            return
        here = tuple(ast.Index(i, st.span) for i in st.indices)
        # a scatter-add's adjoint reads the gradient where it added: a gather
        seed: ast.Expr = ast.Access(grad, vs.places[s] or here, st.span)
        f = vs.rhs[s]
        old = self._old_value(s)  # `max=`, `min=`, `*=`: the value reduced into
        to_old: ast.Expr | None = None  # the adjoint that value gets
        if st.op.reduction in (Reduction.MAX, Reduction.MIN):
            seed_f, to_old = extremum(self, st, f, w, seed, old, self._reuses(st, f, w, old))
            contributions = read_adjoints(f, seed_f)
        elif st.op.reduction is Reduction.PROD:
            contributions, to_old = product(self, st, f, seed, old)
        elif st.op is A.ASSIGN:  # the value written is the rhs's: `exp`'s derivative
            written = ast.Access(w.name, here, st.span)
            contributions = read_adjoints(f, seed, written if self._same_type(st, f) else None)
        else:
            contributions = read_adjoints(f, seed)
        self._add_reads(st, contributions, f)
        prev = vs.before[s]
        if not vs.keeps[s] or not self.needs(prev):
            return
        if to_old is None:
            self._pass_through(st, grad, prev)
        else:
            t = vs.tensor(prev)
            self._accumulate(prev, st.indices, self._as(to_old, t.scalar), st.ranges[: len(here)])

    def _reuses(self, st: CheckedStatement, f: ast.Expr, w: Version, old: ast.Expr | None) -> bool:
        """Whether the ties of the extremum `st` compare with the version `w` it writes
        (which the backward recomputes anyway, by the same statement: a temporary, not a
        final output, stored unconverted, with no value reduced into), rather than with
        a result recomputed beside them; a saved `w` only where it reduces a plain read
        (`tcpy.autodiff.saving`)."""
        exact = w.name not in self.savable or isinstance(f, ast.Access)
        final = self.versions.is_final_output(w)
        return old is None and not final and self._same_type(st, f) and exact

    def _same_type(self, st: CheckedStatement, f: ast.Expr) -> bool:
        """Whether `st` stores its rhs `f` unconverted (its tensor's type is `f`'s)."""
        return f.ty is self.cdef.tensor(st.tensor).scalar

    def _old_value(self, s: int) -> ast.Expr | None:
        """For a `max=`, `min=` or `*=` without `!` (statement `s`), the value it
        reduces into at its indices (its tensor's version before, or zero); None for
        other statements. Only where it writes the whole tensor."""
        st, vs = self.cdef.statements[s], self.versions
        if st.op.initializes or st.op.reduction in (None, Reduction.SUM):
            return None
        if not covers(st, vs.tensor(vs.written[s]).shape):
            raise TCGradientError(
                f"{st.op.value} into part of {st.tensor} has no gradient rule; write "
                f"{st.op.value}! into a temporary and combine it in a statement of its own",
                st.span,
            )
        prev = vs.before[s]
        if prev.zeros:
            return b.num(0, st.span)
        return ast.Access(prev.name, tuple(ast.Index(i, st.span) for i in st.indices), st.span)

    def _read_adjoint(self, v: Version) -> str | None:
        """The name of the adjoint of `v`, complete now that every later statement has
        added to it: the gradient given, for an output no statement read after its
        last write; None where no statement added to it (it is zero)."""
        if v.name not in self.started:
            return f"d_{v.tensor}" if self.versions.is_final_output(v) else None
        return self.adjoint[v.name]

    def _add_reads(
        self, st: CheckedStatement, contributions: list[tuple[ast.Access, ast.Expr]], f: ast.Expr
    ) -> None:
        """Add each read's adjoint in `st` (of right-hand side `f`, reading versions)."""
        merged: dict[tuple[str, str], tuple[ast.Access, ast.Expr]] = {}
        for read, adj in contributions:
            v = self.versions.of.get(read.tensor)
            if v is None or not self.needs(v):
                continue
            key = (read.tensor, ", ".join(text.expr(a) for a in read.args))
            old = merged.get(key)
            merged[key] = (read, adj if old is None else b.add(old[1], adj))
        guarded = {text.expr(a) for a, under in guarded_accesses(f) if under}
        for read, adj in merged.values():
            v = self.versions.of[read.tensor]
            shape = self.versions.tensor(v).shape
            solved = solve(st, read.args, shape, self.taken)
            if solved.unsolved and text.expr(read) not in guarded:
                self._scatter(v, st, read, adj)
                continue
            body = b.simplified(b.substitute(adj, solved.values))
            if solved.guard is not None:
                padded = None if solved.unsolved else self._padded(st, solved, shape, adj)
                if padded is not None:
                    body = padded
                else:
                    body = b.select(b.simplified(solved.guard), body, b.num(0, st.span))
            body = self._as(body, self.versions.tensor(v).scalar)
            ranges = [IndexRange(d, Sym.of(0), e) for d, e in zip(solved.dims, shape, strict=True)]
            self._accumulate(v, solved.dims, body, (*ranges, *solved.free))

    def _padded(
        self, st: CheckedStatement, solved: Solved, shape: tuple[Sym, ...], adj: ast.Expr
    ) -> ast.Expr | None:
        """`adj` at `solved`'s indices with no guard: its one factor that reads at the
        indices the guard bounds read from a copy of its tensor padded with zeros (the
        copy's statement emitted now); None where `adj` is not such a product."""
        bounded = set(solved.bounded)
        factors = _factors(adj)
        at = [f for f in factors if _indices(f) & bounded]
        if len(at) != 1 or not isinstance(at[0], ast.Access):
            return None
        read = at[0]
        names = [a.name if isinstance(a, ast.Index) else None for a in read.args]
        if None in names or len(set(names)) != len(names) or read.tensor not in self.types:
            return None
        if not bounded <= set(names):  # a condition on an index no read carries stays
            return None
        ranges = [IndexRange(d, Sym.of(0), e) for d, e in zip(solved.dims, shape, strict=True)]
        ranges += solved.free
        dims = self.dims(len(names))
        pad_ranges, shifts, within = [], [], None
        for d, var in zip(dims, names, strict=True):
            assert var is not None
            r = st.range_of(var)
            if var not in bounded:
                if r.lo != Sym.of(0):
                    return None
                pad_ranges.append(IndexRange(d, Sym.of(0), r.hi))
                shifts.append(Sym.of(0))
                continue
            values = affine_span(solved.values[var], ranges)
            if values is None:
                return None
            # the pad before the tensor: the values below 0, with the sizes at least 1
            if provably_positive(1 - values[0]):
                shift = -values[0]
            elif provably_positive(values[0] + 1):
                shift = Sym.of(0)
            else:
                return None
            pad_ranges.append(IndexRange(d, Sym.of(0), values[1] + shift))
            shifts.append(shift)
            at_var = b.sub(ast.Index(d, st.span), b.size(shift, st.span))
            within = b.both(within, b.binary(ast.BinaryOp.GE, at_var, b.size(r.lo, st.span)))
            within = b.both(within, b.binary(ast.BinaryOp.LT, at_var, b.size(r.hi, st.span)))
        assert within is not None
        source = tuple(
            b.simplified(b.sub(ast.Index(d, st.span), b.size(k, st.span)))
            for d, k in zip(dims, shifts, strict=True)
        )
        name = self.temporary(f"{read.tensor}_padded", self.types[read.tensor])
        value = b.select(within, ast.Access(read.tensor, source, st.span), b.num(0, st.span))
        self.emit(name, dims, A.ASSIGN, value, pad_ranges)
        shifted = tuple(
            b.add(ast.Index(v, st.span), b.size(k, st.span)) if v in bounded else a
            for v, k, a in zip(names, shifts, read.args, strict=True)
        )
        moved = ast.transform(
            adj, lambda n: ast.Access(name, shifted, n.span) if n is read else None
        )
        return b.simplified(b.substitute(moved, solved.values))

    def _scatter(self, v: Version, st: CheckedStatement, read: ast.Access, adj: ast.Expr) -> None:
        """Add `adj`, over the instances of `st`, into the adjoint of `v` where `read`
        reads it: a scatter-add, for a read whose subscripts no index solves (a gather,
        a stride, a repeated index). The sum then costs the forward's work, not the
        forward's times the tensor's; a read under a condition keeps the gather form
        (`solve`), whose subscripts are evaluated only where the forward evaluated them."""
        t = self.versions.tensor(v)
        self._start(v, self.dims(len(t.shape)))
        self.read |= {n.tensor for a in read.args for n in ast.walk(a) if isinstance(n, ast.Access)}
        body = self._as(b.simplified(adj), t.scalar)
        places = [text.expr(a) for a in read.args]
        self.emit(self.adjoint[v.name], places, A.SUM, body, st.ranges)

    def _pass_through(self, st: CheckedStatement, grad: str, prev: Version) -> None:
        """The adjoint of `prev`, the version before the one `st` writes (whose adjoint
        is `grad`), where `st` kept its values: everywhere after a `+=`, outside the
        written box after another write."""
        t = self.versions.tensor(prev)
        dims = self.dims(len(t.shape))
        value: ast.Expr = ast.Access(grad, tuple(ast.Index(d, st.span) for d in dims), st.span)
        if not (st.op.is_reduction and not st.op.initializes):
            outside = None
            for d, var in zip(dims, st.indices, strict=True):
                r = st.range_of(var)
                i = ast.Index(d, st.span)
                lo = b.binary(ast.BinaryOp.LT, i, b.size(r.lo, st.span))
                hi = b.binary(ast.BinaryOp.GE, i, b.size(r.hi, st.span))
                outside = b.either(outside, b.either(lo, hi))
            if outside is not None:
                value = b.select(outside, value, b.num(0, st.span))
        self._accumulate(prev, dims, value, self.whole(t, dims))

    def _accumulate(
        self, v: Version, dims: Sequence[str], value: ast.Expr, ranges: Sequence[IndexRange]
    ) -> None:
        """Add `value` (over `ranges`, the first for `dims`) to the adjoint of `v`."""
        if v.name not in self.started and not self.versions.is_final_output(v):
            self.started.add(v.name)
            self.adjoint[v.name] = self._name_of(v.name)
            # with nothing summed over, `+=!` would store 0 and then add: `=` stores once
            op = A.SUM_INIT if len(ranges) > len(dims) else A.ASSIGN
            self.emit(self.adjoint[v.name], dims, op, value, ranges)
            return
        self._start(v, dims)
        self.emit(self.adjoint[v.name], dims, A.SUM, value, ranges)

    def _start(self, v: Version, dims: Sequence[str]) -> None:
        """Write the adjoint of `v` whole, unless a statement did: the gradient given
        for a final output (the reads' adjoints add to it), else zero."""
        if v.name in self.started:
            return
        self.started.add(v.name)
        t = self.versions.tensor(v)
        whole = self.whole(t, dims)
        if self.versions.is_final_output(v):
            name = self.adjoint[v.name] = self.temporary(f"d_{v.tensor}_sum", t.scalar)
            given = ast.Access(f"d_{v.tensor}", tuple(ast.Index(d, t.span) for d in dims), t.span)
            self.emit(name, dims, A.ASSIGN, given, whole)
            return
        self.adjoint[v.name] = self._name_of(v.name)
        self.emit(self.adjoint[v.name], dims, A.ASSIGN, b.num(0, t.span), whole)

    def _name_of(self, version: str) -> str:
        name = f"d_{version}" if version in self.wrt else fresh(f"d_{version}", self.taken)
        self.types[name] = self.versions.tensor(self.versions.of[version]).scalar
        return name

    def _as(self, value: ast.Expr, target: ScalarType) -> ast.Expr:
        """`value` cast to `target` where it computes in a wider float type (the
        gradient of a float32 input read into a float64 sum)."""
        floats = [
            self.types.get(n.tensor) if isinstance(n, ast.Access) else n.to
            for n in ast.walk(value)
            if isinstance(n, ast.Access | ast.Cast)
        ]
        widest = max((t.dtype.itemsize for t in floats if t is not None and t.is_float), default=0)
        return b.cast(target, value) if widest > target.dtype.itemsize else value


def _factors(e: ast.Expr) -> list[ast.Expr]:
    """The factors of a product (`e` alone when it is none)."""
    if isinstance(e, ast.Binary) and e.op is ast.BinaryOp.MUL:
        return _factors(e.lhs) + _factors(e.rhs)
    return [e]


def _indices(e: ast.Expr) -> set[str]:
    return {n.name for n in ast.walk(e) if isinstance(n, ast.Index)}
