"""Affine forms of TC's integer expressions: subscripts and range bounds as a sum of
coefficient times index, plus a symbolic part in the sizes (`Linear`)."""

from __future__ import annotations

from dataclasses import dataclass

from tcpy.parser import ast
from tcpy.parser.symbolic import Sym


@dataclass(frozen=True, slots=True)
class Linear:
    """An affine integer expression: sum of coefficient * index, plus a `Sym`."""

    coeffs: tuple[tuple[str, int], ...]
    rest: Sym

    def coeff(self, var: str) -> int:
        return dict(self.coeffs).get(var, 0)

    @property
    def variables(self) -> tuple[str, ...]:
        return tuple(v for v, _ in self.coeffs)

    def __add__(self, other: Linear) -> Linear:
        c = dict(self.coeffs)
        for v, k in other.coeffs:
            c[v] = c.get(v, 0) + k
        return Linear(tuple(sorted((v, k) for v, k in c.items() if k)), self.rest + other.rest)

    def scale(self, k: int) -> Linear:
        return Linear(tuple((v, c * k) for v, c in self.coeffs if c * k), self.rest * k)


def linear_form(e: ast.Expr) -> Linear | None:
    """The affine form of a resolved integer expression, or None if it is not affine
    in the indices with integer coefficients (gathers, %, index * size, ...)."""
    match e:
        case ast.IntLit(value=v):
            return Linear((), Sym.of(v))
        case ast.Index(name=n):
            return Linear(((n, 1),), Sym())
        case ast.SizeRef(name=n):
            return Linear((), Sym.of(n))
        case ast.Unary(op=ast.UnaryOp.NEG, operand=v):
            inner = linear_form(v)
            return inner.scale(-1) if inner else None
        case ast.Cast(to=to, value=v) if to.is_integer and v.ty is not None and v.ty.is_integer:
            return linear_form(v)
        case ast.Binary(op=ast.BinaryOp.ADD | ast.BinaryOp.SUB as op, lhs=a, rhs=b):
            la, lb = linear_form(a), linear_form(b)
            if la is None or lb is None:
                return None
            return la + (lb if op is ast.BinaryOp.ADD else lb.scale(-1))
        case ast.Binary(op=ast.BinaryOp.MUL, lhs=a, rhs=b):
            la, lb = linear_form(a), linear_form(b)
            if la is None or lb is None:
                return None
            for x, y in ((la, lb), (lb, la)):
                if not x.coeffs and x.rest.is_const:
                    return y.scale(x.rest.const)
            return None
    return None
