"""A def's tensors as versions: each statement writes a new version of its tensor (TC's
`O +=! ...; O = O + b; O = fmax(O, 0)` writes three), and each read names the version
the statements before it left. Version 0 is an input's value, or the zeros an output
or temporary holds before its first write."""

from __future__ import annotations

from dataclasses import dataclass

from tcpy.autodiff import build as b
from tcpy.parser import ast
from tcpy.parser.checked import CheckedDef, CheckedStatement, Role, TensorInfo
from tcpy.parser.symbolic import Sym


@dataclass(frozen=True)
class Version:
    """Version `k` of `tensor` (0: before any write), written by statement `statement`,
    named `name` in a backward (`zeros`: none, it reads as zero)."""

    tensor: str
    k: int
    statement: int | None
    name: str

    @property
    def zeros(self) -> bool:
        return self.k == 0 and self.statement is None and self.name == ""


@dataclass
class Versions:
    """The versions of a def's tensors (`of`), what each statement reads (its rhs with
    reads renamed to their versions, `rhs`) and writes (`written`), and whether the
    version a statement writes keeps values of the one before (`keeps`: a `+=` or
    a write of part of the tensor); a scatter-add's subscripts, renamed so (`places`,
    empty for other statements)."""

    cdef: CheckedDef
    of: dict[str, Version]  # by name in the backward
    rhs: list[ast.Expr]
    written: list[Version]
    before: list[Version]  # the version of its tensor before each statement
    keeps: list[bool]
    places: list[tuple[ast.Expr, ...]]

    def tensor(self, v: Version) -> TensorInfo:
        return self.cdef.tensor(v.tensor)

    def is_final_output(self, v: Version) -> bool:
        t = self.tensor(v)
        return t.role is Role.OUTPUT and v is self.last(v.tensor)

    def last(self, tensor: str) -> Version:
        return max((v for v in self.of.values() if v.tensor == tensor), key=lambda v: v.k)

    def reads(self, s: int) -> list[Version]:
        """The versions statement `s` reads, in order, each once."""
        out: list[Version] = []
        for n in (n for e in (self.rhs[s], *self.places[s]) for n in ast.walk(e)):
            if isinstance(n, ast.Access) and n.tensor in self.of and self.of[n.tensor] not in out:
                out.append(self.of[n.tensor])
        return out


def versions_of(cdef: CheckedDef, taken: set[str]) -> Versions:
    """The versions of `cdef`'s tensors; a version other than a tensor's last is named
    `<tensor>_<k>`, kept clear of the names in `taken` (which it extends)."""
    writes: dict[str, int] = {}
    for st in cdef.statements:
        writes[st.tensor] = writes.get(st.tensor, 0) + 1
    current: dict[str, Version] = {}
    for t in cdef.tensors:
        name = t.name if t.role is Role.INPUT else ""
        current[t.name] = Version(t.name, 0, None, name)
    of = {v.name: v for v in current.values() if v.name}
    rhs: list[ast.Expr] = []
    written: list[Version] = []
    before: list[Version] = []
    keeps: list[bool] = []
    places: list[tuple[ast.Expr, ...]] = []
    for s, st in enumerate(cdef.statements):
        rhs.append(_renamed(st.rhs, current))
        places.append(tuple(_renamed(a, current) for a in st.scatter))
        prev = current[st.tensor]
        k = prev.k + 1
        name = st.tensor if k == writes[st.tensor] else fresh(f"{st.tensor}_{k}", taken)
        v = Version(st.tensor, k, s, name)
        of[name] = v
        before.append(prev)
        written.append(v)
        keeps.append(_keeps(st, cdef.tensor(st.tensor).shape))
        current[st.tensor] = v
    return Versions(cdef, of, rhs, written, before, keeps, places)


def _renamed(rhs: ast.Expr, current: dict[str, Version]) -> ast.Expr:
    """`rhs` reading the current versions: by their names, zeros as 0."""

    def one(n: ast.Expr) -> ast.Expr | None:
        if isinstance(n, ast.Access) and n.tensor in current and current[n.tensor].zeros:
            return b.num(0, n.span)
        return None

    zeroed = ast.transform(rhs, one)
    return b.rename(zeroed, lambda n: current[n.tensor].name if n.tensor in current else n.tensor)


def _keeps(st: CheckedStatement, shape: tuple[Sym, ...]) -> bool:
    """Whether the version `st` writes keeps values of the one before: it adds to them
    (a reduction without `!`), or writes only part of the tensor."""
    if st.op.is_reduction and not st.op.initializes:
        return True
    return not covers(st, shape)


def covers(st: CheckedStatement, shape: tuple[Sym, ...]) -> bool:
    """Whether `st` writes every element of its tensor, of `shape`."""
    for var, extent in zip(st.indices, shape, strict=True):
        r = st.range_of(var)
        if r.lo != Sym.of(0) or r.hi != extent:
            return False
    return True


def fresh(name: str, taken: set[str]) -> str:
    """`name`, or `name_2`, `name_3`, ... if taken; marked taken."""
    out, k = name, 2
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    taken.add(out)
    return out
