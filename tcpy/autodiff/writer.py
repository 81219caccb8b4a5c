"""The text of a backward being derived (`Writer`): the statements it emits, the names
and types of the tensors it makes, the statements that recompute the forward's values
it reads, and its signature; and the forward that saves values for it."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from tcpy.autodiff import build as b
from tcpy.autodiff import text
from tcpy.autodiff.recovery import recovered
from tcpy.autodiff.versions import fresh, versions_of
from tcpy.parser import ast
from tcpy.parser.checked import CheckedDef, IndexRange, TensorInfo
from tcpy.parser.sema import weakly_typed
from tcpy.parser.symbolic import Sym
from tcpy.types import ScalarType

A = ast.AssignOp


@dataclass
class Writer:
    """The statements of a backward of `cdef` (`emitted`, in order; `lines` as TC text),
    the names taken,
    the element type of each tensor it makes (`types`), and the tensors its statements
    read (`read`)."""

    cdef: CheckedDef
    taken: set[str] = field(default_factory=set)
    read: set[str] = field(default_factory=set)
    emitted: list[Emitted] = field(default_factory=list)

    def __post_init__(self) -> None:
        c = self.cdef
        self.taken |= {t.name for t in c.tensors} | set(c.size_symbols)
        self.indices = {i for st in c.statements for i in st.all_indices}
        self.taken |= self.indices
        self.versions = versions_of(c, self.taken)
        self.sizes: dict[tuple[str, int], str] = {}  # parameters' computed dimensions
        self.types = {n: self.versions.tensor(v).scalar for n, v in self.versions.of.items()}
        self.types |= {f"d_{t.name}": t.scalar for t in c.outputs}

    def temporary(self, name: str, scalar: ScalarType) -> str:
        """A fresh name like `name` for a tensor of `scalar` elements."""
        out = fresh(name, self.taken)
        self.types[out] = scalar
        return out

    def dims(self, rank: int) -> tuple[str, ...]:
        """Indices for a statement over a whole tensor of `rank` dimensions."""
        names = ("i", "j", "k", "l", "m", "n")
        chosen = [n for n in names if n not in self.taken - self.indices]
        return tuple(chosen[k] if k < len(chosen) else f"i{k}" for k in range(rank))

    def whole(self, t: TensorInfo, dims: Sequence[str]) -> tuple[IndexRange, ...]:
        return tuple(IndexRange(d, Sym.of(0), e) for d, e in zip(dims, t.shape, strict=True))

    @property
    def lines(self) -> list[str]:
        """The statements emitted so far, as TC text."""
        return [st.line() for st in self.emitted]

    def emit(
        self,
        tensor: str,
        dims: Sequence[str],
        op: ast.AssignOp,
        value: ast.Expr,
        ranges: Sequence[IndexRange],
    ) -> None:
        self.read |= {n.tensor for n in ast.walk(value) if isinstance(n, ast.Access)}
        statement = Emitted(tensor, tuple(dims), op, value, tuple(ranges))
        self.emitted.append(statement)

    def merge_sums(self) -> None:
        """Fold the statements that add to a tensor after its first write into that
        write, where they run over the same indices and ranges and nothing between
        reads or writes it otherwise (a backward's `d_e(n,d) = ...` then `d_e(n,d) +=
        d_s(n)`: one pass over `d_e` instead of two; a layer norm's `d_X`, written once
        and added to twice: one instead of three). The sum moves to the last of them,
        where every value it reads is computed (TC lets a sum be reassociated); past
        other additions to the tensor (a cross-entropy's scatter-add of its labels'
        term between `d_X`'s zeros and its point-wise term), it stays at the first
        write, where what it reads is computed already."""
        out: list[Emitted] = []
        for st in self.emitted:
            found = _merge_target(out, st)
            if found is None:
                out.append(st)
                continue
            first, passed = found
            head = out[first]
            renamed = {
                d: ast.Index(h, st.value.span) for d, h in zip(st.dims, head.dims, strict=True)
            }
            value = b.add(head.value, b.substitute(st.value, renamed))
            merged = Emitted(head.tensor, head.dims, head.op, value, head.ranges)
            if passed:
                out[first] = merged
            else:
                out.pop(first)
                out.append(merged)
        self.emitted = out

    def reuse_values(self) -> None:
        """Read a statement's whole value from a tensor an earlier point-wise statement
        wrote it to, where it runs over that statement's indices and ranges (and
        perhaps more: a sum), and nothing between writes what either reads (a bias's
        gradient `d_b(o) +=! <d_Z's value>`, the same partial of `Z(n, o) + b(o)`:
        `d_b(o) +=! d_Z(n, o)`, a GELU's `erf` and `exp` computed once, not twice)."""
        out: list[Emitted] = []
        for st in self.emitted:
            source = _reusable(out, st)
            if source is not None:
                read = ast.Access(
                    source.tensor,
                    tuple(ast.Index(d, st.value.span) for d in source.dims),
                    st.value.span,
                )
                st = Emitted(st.tensor, st.dims, st.op, read, st.ranges)
            out.append(st)
        self.emitted = out

    def inline_once(self, kept: Collection[str]) -> None:
        """Substitute the value of a point-wise statement into the one statement that
        reads it, where that one runs point-wise over the same indices and ranges,
        reads it there, and nothing between writes what the value reads (a softmax
        backward's `d_e(n, d) = d_Y(n, d) / s(n) + d_s(n)`, read by `d_X(n, d) =
        d_e(n, d) * e(n, d)`: no `d_e`, a pass less); the tensors of `kept` stay."""
        out = list(self.emitted)
        k = 0
        while k < len(out):
            j = _inline_target(out, k, kept)
            if j is None:
                k += 1
                continue
            st = out.pop(k)
            value = st.value
            if self.types[st.tensor] not in (ScalarType.FLOAT32, ScalarType.FLOAT64):
                value = b.cast(self.types[st.tensor], value)  # as the tensor stored it
            into = out[j - 1]
            new = _read_back(into.value, {st.tensor: (st.dims, value)})  # read at its dims
            out[j - 1] = Emitted(into.tensor, into.dims, into.op, new, into.ranges)
        self.emitted = out

    # --- the forward's values -------------------------------------------------------

    def recompute(self, saved: set[str]) -> tuple[list[str], set[str], list[str]]:
        """The statements that recompute the versions the statements read (temporaries,
        versions overwritten) but those in `saved`, in the forward's order (a value
        the forward divided into an output read back from it, `tcpy.autodiff.
        recovery`); the forward outputs read; the saved versions read, in the
        forward's order."""
        vs = self.versions
        needed: set[int] = set()
        taken: set[int] = set()
        recovering: dict[int, ast.Expr] = {}
        stack = [vs.of[n] for n in vs.of if n in self.read]
        while stack:
            v = stack.pop()
            if v.statement is None or vs.is_final_output(v) or v.statement in needed:
                continue
            if v.name in saved:
                taken.add(v.statement)
                continue
            needed.add(v.statement)
            back = recovered(
                vs,
                v.statement,
                lambda r: r.name in saved or r.statement is None or vs.is_final_output(r),
            )
            if back is not None:
                recovering[v.statement] = back
                stack += [vs.of[n.tensor] for n in ast.walk(back) if isinstance(n, ast.Access)]
                continue
            stack += vs.reads(v.statement)
            if vs.keeps[v.statement] and not vs.before[v.statement].zeros:
                stack.append(vs.before[v.statement])
        # a value read back is a product of two reads: each read of it takes the
        # product in its place (no tensor to fill, no pass over it)
        inlined = {
            vs.written[s].name: (self.cdef.statements[s].indices, back)
            for s, back in recovering.items()
        }
        self.emitted = [
            Emitted(st.tensor, st.dims, st.op, _read_back(st.value, inlined), st.ranges)
            for st in self.emitted
        ]
        self.read |= {
            n.tensor for e in recovering.values() for n in ast.walk(e) if isinstance(n, ast.Access)
        }
        lines = self._recomputing(sorted(needed - recovering.keys()), inlined)
        outputs = {vs.last(t.name).name for t in self.cdef.outputs}
        return lines, outputs & self.read, [vs.written[s].name for s in sorted(taken)]

    def _recomputing(
        self, statements: Sequence[int], inlined: Mapping[str, Inlined] | None = None
    ) -> list[str]:
        """The lines of the forward's `statements` as the backward recomputes them (the
        reads of a version of `inlined` replaced by its value)."""
        kept, self.emitted = self.emitted, []
        for s in statements:
            self._recompute_one(s, inlined or {})
        lines, self.emitted = self.lines, kept
        return lines

    def _recompute_one(self, s: int, inlined: Mapping[str, Inlined]) -> None:
        vs = self.versions
        st, w = self.cdef.statements[s], vs.written[s]
        t = vs.tensor(w)
        rhs = _read_back(vs.rhs[s], inlined)
        if vs.keeps[s]:
            dims = self.dims(len(t.shape))
            prev = vs.before[s]
            old: ast.Expr = (
                b.cast(t.scalar, b.num(0, st.span))  # its first write gives a tensor its type
                if prev.zeros
                else ast.Access(prev.name, tuple(ast.Index(d, st.span) for d in dims), st.span)
            )
            self.emit(w.name, dims, A.ASSIGN, old, self.whole(t, dims))
        elif rhs.ty is not None and (
            rhs.ty is not t.scalar or (weakly_typed(rhs) and t.scalar is not ScalarType.FLOAT32)
        ):  # a version's first write: the tensor's type, as stored (a literal alone: float32)
            rhs = b.cast(t.scalar, rhs)
        places = vs.places[s]
        self.read |= {n.tensor for a in places for n in ast.walk(a) if isinstance(n, ast.Access)}
        lhs = [text.expr(a) for a in places] if places else st.indices
        self.emit(w.name, lhs, st.op, rhs, st.ranges)

    # --- the defs ---------------------------------------------------------------------

    def backward(self, wrt: Sequence[str], saved: set[str]) -> tuple[str, tuple[str, ...]]:
        """The backward's text, its statements after the recomputed ones, and the saved
        versions it takes (those of `saved` it reads)."""
        c, vs = self.cdef, self.versions
        recompute, outputs_read, taken = self.recompute(saved)
        params = [self._param(t, t.name) for t in c.inputs]
        params += [self._param(t, t.name) for t in c.outputs if t.name in outputs_read]
        params += [self._param(vs.tensor(vs.of[n]), n) for n in taken]
        params += [self._param(t, f"d_{t.name}") for t in c.outputs if t.scalar.is_float]
        results = [self._param(c.tensor(n), f"d_{n}") for n in wrt]
        head = f"def {c.name}_grad({', '.join(params)}) -> ({', '.join(results)})"
        body = "".join(f"    {line}\n" for line in (*recompute, *self.lines))
        return f"{head} {{\n{body}}}\n", tuple(taken)

    def forward(self, saved: Sequence[str]) -> str:
        """The forward returning the `saved` versions after its outputs: its statements
        as the backward recomputes them (versions named apart)."""
        c = self.cdef
        lines = self._recomputing(range(len(c.statements)))
        params = ", ".join(self._param(t, t.name) for t in c.inputs)
        results = ", ".join([t.name for t in c.outputs] + list(saved))
        body = "".join(f"    {line}\n" for line in lines)
        return f"def {c.name}_saving({params}) -> ({results}) {{\n{body}}}\n"

    def _param(self, t: TensorInfo, name: str) -> str:
        dims = [self._dim(t, k, e) for k, e in enumerate(t.shape)]
        return f"{t.scalar.value}({', '.join(dims)}) {name}" if dims else f"{t.scalar.value} {name}"

    def _dim(self, t: TensorInfo, k: int, extent: Sym) -> str:
        """A dimension of a parameter: its size, or a size of its own where the forward
        computes it (an output `H - KH + 1` long)."""
        if extent.is_const or (
            len(extent.terms) == 1
            and extent.const == 0
            and extent.terms[0][1] == 1
            and isinstance(extent.terms[0][0], str)
        ):
            return text.size(extent)
        key = (t.name, k)
        if key not in self.sizes:
            self.sizes[key] = fresh(f"{t.name}_dim{k}", self.taken)
        return self.sizes[key]


@dataclass(frozen=True)
class Emitted:
    """A statement of a backward: `tensor(dims) op value where ranges`."""

    tensor: str
    dims: tuple[str, ...]
    op: ast.AssignOp
    value: ast.Expr
    ranges: tuple[IndexRange, ...]

    def line(self) -> str:
        lhs = f"{self.tensor}({', '.join(self.dims)})" if self.dims else self.tensor
        where = ", ".join(f"{r.var} in {text.size(r.lo)}:{text.size(r.hi)}" for r in self.ranges)
        return f"{lhs} {self.op.value} {text.expr(self.value)}" + (
            f" where {where}" if where else ""
        )

    def reads(self, tensor: str) -> bool:
        return any(isinstance(n, ast.Access) and n.tensor == tensor for n in ast.walk(self.value))


def _reusable(done: list[Emitted], st: Emitted) -> Emitted | None:
    """The earlier statement of `done` whose tensor holds `st`'s whole value at the
    same instances (see `Writer.reuse_values`), or None."""
    value = text.expr(st.value)
    if isinstance(st.value, ast.Access):
        return None  # a read already
    ranges = {(r.var, r.lo, r.hi) for r in st.ranges}
    for k in reversed(range(len(done))):
        other = done[k]
        if (
            other.op is A.ASSIGN
            and len(other.ranges) == len(other.dims)
            and tuple(r.var for r in other.ranges) == other.dims
            and {(r.var, r.lo, r.hi) for r in other.ranges} <= ranges
            and text.expr(other.value) == value
            and not any(st.reads(o.tensor) or o.tensor == other.tensor for o in done[k + 1 :])
            and not other.reads(other.tensor)
        ):
            return other
    return None


Inlined = tuple[tuple[str, ...], ast.Expr]
"""A version's value in its statement's indices (those indices, the value)."""


def _read_back(e: ast.Expr, inlined: Mapping[str, Inlined]) -> ast.Expr:
    """`e` with each read of a version of `inlined` replaced by its value, at the
    read's subscripts."""
    if not inlined:
        return e

    def one(n: ast.Expr) -> ast.Expr | None:
        if not (isinstance(n, ast.Access) and n.tensor in inlined):
            return None
        dims, value = inlined[n.tensor]
        args = [_read_back(a, inlined) for a in n.args]
        return b.substitute(value, dict(zip(dims, args, strict=True)))

    return ast.transform(e, one)


def _inline_target(done: list[Emitted], k: int, kept: Collection[str]) -> int | None:
    """The position of the one statement after `done[k]` that `done[k]`'s value can
    be substituted into (see `Writer.inline_once`), or None."""
    st = done[k]
    if st.op is not A.ASSIGN or st.tensor in kept or len(st.ranges) != len(st.dims):
        return None
    readers = [j for j in range(k + 1, len(done)) if done[j].reads(st.tensor)]
    if len(readers) != 1 or any(o.tensor == st.tensor for o in done[k + 1 :]):
        return None
    j = readers[0]
    into = done[j]
    if (into.dims, into.ranges) != (st.dims, st.ranges) or st.reads(st.tensor):
        return None
    reads = [n for n in ast.walk(into.value) if isinstance(n, ast.Access) and n.tensor == st.tensor]
    if len(reads) != 1 or not b.reads_at(reads[0], st.tensor, st.dims):
        return None
    if any(st.reads(o.tensor) for o in done[k + 1 : j + 1]):
        return None  # what the value reads is written before the read
    return j


def _merge_target(done: list[Emitted], st: Emitted) -> tuple[int, bool] | None:
    """The position in `done` of the write of `st`'s tensor that `st` (a `+=`) can be
    folded into (see `Writer.merge_sums`), and whether other additions to the tensor
    come between; or None."""
    if st.op is not A.SUM or st.reads(st.tensor):
        return None
    passed = False
    for k in reversed(range(len(done))):
        other = done[k]
        if other.tensor == st.tensor:
            if other.op is A.SUM and not other.reads(st.tensor):
                passed = True  # additions commute
                continue
            if not _same_domain(other, st) or other.op not in (A.ASSIGN, A.SUM_INIT):
                return None
            if passed and any(st.reads(o.tensor) for o in done[k + 1 :]):
                return None  # what `st` adds is computed after the first write
            return k, passed
        if other.reads(st.tensor):
            return None
    return None


def _same_domain(a: Emitted, b: Emitted) -> bool:
    """Whether `a` and `b` run over the same indices and ranges, or over the same
    ranges point-wise with indices named otherwise."""
    if (a.dims, a.ranges) == (b.dims, b.ranges):
        return True
    point_wise = all(len(s.ranges) == len(s.dims) for s in (a, b))
    bounds = [(r.lo, r.hi) for r in a.ranges] == [(r.lo, r.hi) for r in b.ranges]
    in_order = all(tuple(r.var for r in s.ranges) == s.dims for s in (a, b))
    return point_wise and bounds and in_order
