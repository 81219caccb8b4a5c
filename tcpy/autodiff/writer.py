"""The text of a backward being derived (`Writer`): the statements it emits, the names
and types of the tensors it makes, the statements that recompute the forward's values
it reads, and its signature; and the forward that saves values for it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tcpy.autodiff import build as b
from tcpy.autodiff import text
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
        where every value it reads is computed (TC lets a sum be reassociated)."""
        out: list[Emitted] = []
        for st in self.emitted:
            first = _merge_target(out, st)
            if first is None:
                out.append(st)
                continue
            head = out.pop(first)
            out.append(Emitted(st.tensor, st.dims, head.op, b.add(head.value, st.value), st.ranges))
        self.emitted = out

    # --- the forward's values -------------------------------------------------------

    def recompute(self, saved: set[str]) -> tuple[list[str], set[str], list[str]]:
        """The statements that recompute the versions the statements read (temporaries,
        versions overwritten) but those in `saved`, in the forward's order; the forward
        outputs read; the saved versions read, in the forward's order."""
        vs = self.versions
        needed: set[int] = set()
        taken: set[int] = set()
        stack = [vs.of[n] for n in vs.of if n in self.read]
        while stack:
            v = stack.pop()
            if v.statement is None or vs.is_final_output(v) or v.statement in needed:
                continue
            if v.name in saved:
                taken.add(v.statement)
                continue
            needed.add(v.statement)
            stack += vs.reads(v.statement)
            if vs.keeps[v.statement] and not vs.before[v.statement].zeros:
                stack.append(vs.before[v.statement])
        lines = self._recomputing(sorted(needed))
        outputs = {vs.last(t.name).name for t in self.cdef.outputs}
        return lines, outputs & self.read, [vs.written[s].name for s in sorted(taken)]

    def _recomputing(self, statements: Sequence[int]) -> list[str]:
        """The lines of the forward's `statements` as the backward recomputes them."""
        kept, self.emitted = self.emitted, []
        for s in statements:
            self._recompute_one(s)
        lines, self.emitted = self.lines, kept
        return lines

    def _recompute_one(self, s: int) -> None:
        vs = self.versions
        st, w = self.cdef.statements[s], vs.written[s]
        t = vs.tensor(w)
        rhs = vs.rhs[s]
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


def _merge_target(done: list[Emitted], st: Emitted) -> int | None:
    """The position in `done` of the write of `st`'s tensor that `st` (a `+=`) can be
    folded into (see `Writer.merge_sums`), or None."""
    if st.op is not A.SUM or st.reads(st.tensor):
        return None
    for k in reversed(range(len(done))):
        other = done[k]
        if other.tensor == st.tensor:
            same = (other.dims, other.ranges) == (st.dims, st.ranges)
            return k if same and other.op in (A.ASSIGN, A.SUM_INIT) else None
        if other.reads(st.tensor):
            return None
    return None
