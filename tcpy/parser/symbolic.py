"""Integer expressions in the size symbols: ranges and tensor shapes.

A `Sym` is a canonical integer-linear combination of atoms plus a constant; an atom
is a size symbol or a non-linear piece (`FloorDiv` by a positive constant, `MinOf`,
`MaxOf`). Canonical means that equal expressions built in different orders compare
equal, which is what the front end needs to decide "this range starts at 0" and to
drop redundant bounds. Evaluation at call time substitutes the sizes of the call.
Division is floor division, as isl means it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FloorDiv:
    num: Sym
    den: int  # > 1

    def __str__(self) -> str:
        num = str(self.num)
        if len(self.num.terms) + (self.num.const != 0) > 1:
            num = f"({num})"
        return f"floor({num}/{self.den})"


@dataclass(frozen=True, slots=True)
class MinOf:
    args: tuple[Sym, ...]

    def __str__(self) -> str:
        return f"min({', '.join(map(str, self.args))})"


@dataclass(frozen=True, slots=True)
class MaxOf:
    args: tuple[Sym, ...]

    def __str__(self) -> str:
        return f"max({', '.join(map(str, self.args))})"


Atom = str | FloorDiv | MinOf | MaxOf


def _atom_key(atom: Atom) -> tuple[int, str]:
    return (0, atom) if isinstance(atom, str) else (1, str(atom))


@dataclass(frozen=True, slots=True)
class Sym:
    terms: tuple[tuple[Atom, int], ...] = ()  # sorted by atom, no zero coefficients
    const: int = 0

    # --- construction -----------------------------------------------------------
    @staticmethod
    def of(value: int | str | Atom) -> Sym:
        if isinstance(value, int):
            return Sym((), value)
        return Sym(((value, 1),), 0)

    @staticmethod
    def _build(coeffs: Mapping[Atom, int], const: int) -> Sym:
        items = sorted(((a, c) for a, c in coeffs.items() if c != 0), key=lambda t: _atom_key(t[0]))
        return Sym(tuple(items), const)

    # --- arithmetic ---------------------------------------------------------------
    def __add__(self, other: Sym | int) -> Sym:
        other = _lift(other)
        coeffs = dict(self.terms)
        for atom, c in other.terms:
            coeffs[atom] = coeffs.get(atom, 0) + c
        return Sym._build(coeffs, self.const + other.const)

    __radd__ = __add__

    def __neg__(self) -> Sym:
        return self * -1

    def __sub__(self, other: Sym | int) -> Sym:
        return self + (-_lift(other))

    def __rsub__(self, other: Sym | int) -> Sym:
        return _lift(other) - self

    def __mul__(self, k: int) -> Sym:
        return Sym._build({a: c * k for a, c in self.terms}, self.const * k)

    __rmul__ = __mul__

    def floordiv(self, d: int) -> Sym:
        """floor(self / d) for a positive constant d, splitting off the divisible part."""
        if d <= 0:
            raise ValueError("division by a non-positive constant")
        if d == 1:
            return self
        whole = {a: c // d for a, c in self.terms if c % d == 0}
        rest = {a: c for a, c in self.terms if c % d != 0}
        if not rest:
            return Sym._build(whole, 0) + self.const // d
        inner = Sym._build(rest, self.const % d)
        return Sym._build(whole, self.const // d) + Sym.of(FloorDiv(inner, d))

    def ceildiv(self, d: int) -> Sym:
        return (self + (d - 1)).floordiv(d)

    # --- queries ------------------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return not self.terms

    def symbols(self) -> frozenset[str]:
        out: set[str] = set()
        for atom, _ in self.terms:
            match atom:
                case str():
                    out.add(atom)
                case FloorDiv(num=n):
                    out |= n.symbols()
                case MinOf(args=args) | MaxOf(args=args):
                    for a in args:
                        out |= a.symbols()
        return frozenset(out)

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        total = self.const
        for atom, c in self.terms:
            total += c * _eval_atom(atom, sizes)
        return total

    def __str__(self) -> str:
        parts: list[str] = []
        for atom, c in sorted(self.terms, key=lambda t: t[1] < 0):
            text = str(atom)
            if c == 1:
                parts.append(f"+ {text}")
            elif c == -1:
                parts.append(f"- {text}")
            else:
                parts.append(f"{'-' if c < 0 else '+'} {abs(c)}*{text}")
        if self.const or not parts:
            parts.append(f"{'-' if self.const < 0 else '+'} {abs(self.const)}")
        text = " ".join(parts)
        return text[2:] if text.startswith("+ ") else "-" + text[2:]


def _lift(x: Sym | int) -> Sym:
    return Sym.of(x) if isinstance(x, int) else x


def _eval_atom(atom: Atom, sizes: Mapping[str, int]) -> int:
    match atom:
        case str():
            return sizes[atom]
        case FloorDiv(num=n, den=d):
            return n.evaluate(sizes) // d
        case MinOf(args=args):
            return min(a.evaluate(sizes) for a in args)
        case MaxOf(args=args):
            return max(a.evaluate(sizes) for a in args)
    raise TypeError(atom)


def sym_min(args: Iterable[Sym]) -> Sym:
    return _extremum(args, smallest=True)


def sym_max(args: Iterable[Sym]) -> Sym:
    return _extremum(args, smallest=False)


def _extremum(args: Iterable[Sym], smallest: bool) -> Sym:
    """min or max, dropping every argument that another exceeds (or undercuts) by a
    known constant, and flattening nested extrema of the same kind."""
    kind = MinOf if smallest else MaxOf
    flat: list[Sym] = []
    for a in args:
        if (
            len(a.terms) == 1
            and a.const == 0
            and a.terms[0][1] == 1
            and isinstance(a.terms[0][0], kind)
        ):
            flat.extend(a.terms[0][0].args)
        else:
            flat.append(a)
    kept: list[Sym] = []
    for a in flat:
        dominated = False
        for i, b in enumerate(kept):
            diff = a - b
            if diff.is_const:
                if (diff.const < 0) == smallest and diff.const != 0:
                    kept[i] = a
                dominated = True
                break
        if not dominated:
            kept.append(a)
    if not kept:
        raise ValueError("extremum of nothing")
    if len(kept) == 1:
        return kept[0]
    kept.sort(key=str)
    return Sym.of(kind(tuple(kept)))


def provably_le(a: Sym, b: Sym) -> bool | None:
    """True when `a <= b` holds for every value of the sizes, False when it fails for
    every value (a constant difference), None when this cannot tell."""
    diff = b - a
    if diff.is_const:
        return diff.const >= 0
    for bound in _lower_bounds(diff):
        if bound.is_const and bound.const >= 0:
            return True
    return None


def _lower_bounds(e: Sym, budget: int = 16) -> list[Sym]:
    """Expressions <= e with the non-linear atoms replaced by linear bounds:
    d*floor(x/d) >= x - d + 1, d*floor(x/d) <= x, max(x, y) >= x, min(x, y) <= x."""
    results = [Sym((), e.const)]
    for atom, c in e.terms:
        options: list[Sym] = []
        match atom:
            case FloorDiv(num=x, den=d) if c % d == 0:
                options = [(x - (d - 1)) * (c // d)] if c > 0 else [x * (c // d)]
            case MaxOf(args=args) if c > 0:
                options = [x * c for x in args]
            case MinOf(args=args) if c < 0:
                options = [x * c for x in args]
            case _:
                options = [Sym(((atom, c),), 0)]
        results = [r + o for r in results for o in options][:budget]
    return results


def provably_positive(e: Sym) -> bool:
    """True when `e >= 1` for every value of the sizes, which are at least 1 at every
    call (the polyhedral context assumes the same). False when this cannot tell."""
    for bound in _lower_bounds(e):
        # With every coefficient positive on plain sizes, the least value is at 1.
        plain = all(isinstance(atom, str) and c > 0 for atom, c in bound.terms)
        if plain and bound.const + sum(c for _, c in bound.terms) >= 1:
            return True
    return False
