"""isl AST expressions (loop bounds, indices, conditions) and size expressions,
printed as C and CUDA: 64-bit index arithmetic, floor division as isl means it."""

from __future__ import annotations

from collections.abc import Mapping

import islpy as isl

from tcpy.errors import InternalError
from tcpy.naming import size_name
from tcpy.parser.symbolic import FloorDiv, MaxOf, MinOf, Sym

_BINARY = {
    isl.ast_expr_op_type.add: "+",
    isl.ast_expr_op_type.sub: "-",
    isl.ast_expr_op_type.mul: "*",
    isl.ast_expr_op_type.div: "/",
    isl.ast_expr_op_type.pdiv_q: "/",
    isl.ast_expr_op_type.pdiv_r: "%",
    isl.ast_expr_op_type.zdiv_r: "%",
    isl.ast_expr_op_type.and_: "&&",  # type: ignore[attr-defined]
    isl.ast_expr_op_type.and_then: "&&",
    isl.ast_expr_op_type.or_: "||",  # type: ignore[attr-defined]
    isl.ast_expr_op_type.or_else: "||",
    isl.ast_expr_op_type.eq: "==",
    isl.ast_expr_op_type.le: "<=",
    isl.ast_expr_op_type.lt: "<",
    isl.ast_expr_op_type.ge: ">=",
    isl.ast_expr_op_type.gt: ">",
}


def isl_expr(e: isl.AstExpr, names: Mapping[str, str], top: bool = False) -> str:
    """An isl AST expression in C, with isl's parameter names mapped by `names`.
    Fully parenthesised except at the top (OpenMP wants bare loop conditions)."""
    kind = e.get_type()
    if kind == isl.ast_expr_type.int:
        return str(e.int_get_val().to_python())
    if kind == isl.ast_expr_type.id:
        name = e.id_get_id().get_name()
        return names.get(name, name)
    op = e.op_get_type()
    args = [isl_expr(e.op_get_arg(i), names) for i in range(e.op_get_n_arg())]
    if op in _BINARY:
        text = f" {_BINARY[op]} ".join(args)
        return text if top else f"({text})"
    if op == isl.ast_expr_op_type.minus:
        return f"(-{args[0]})"
    if op in (isl.ast_expr_op_type.min, isl.ast_expr_op_type.max):
        fn = "tc_min" if op == isl.ast_expr_op_type.min else "tc_max"
        out = args[0]
        for a in args[1:]:
            out = f"{fn}({out}, {a})"
        return out
    if op == isl.ast_expr_op_type.fdiv_q:
        return f"tc_floord({args[0]}, {args[1]})"
    if op in (isl.ast_expr_op_type.cond, isl.ast_expr_op_type.select):
        return f"({args[0]} ? {args[1]} : {args[2]})"
    raise InternalError(f"unexpected isl AST operation {op}")


def expr_ids(e: isl.AstExpr) -> frozenset[str]:
    """The names of the ids (loop iterators, parameters) an isl AST expression uses."""
    kind = e.get_type()
    if kind == isl.ast_expr_type.id:
        return frozenset({e.id_get_id().get_name()})
    if kind == isl.ast_expr_type.int:
        return frozenset()
    return frozenset().union(*(expr_ids(e.op_get_arg(i)) for i in range(e.op_get_n_arg())))


def expr_int(e: isl.AstExpr) -> int | None:
    """The value of an integer constant, else None."""
    if e.get_type() != isl.ast_expr_type.int:
        return None
    return int(e.int_get_val().to_python())


def expr_id(e: isl.AstExpr) -> str | None:
    """The name of an id expression, else None."""
    return e.id_get_id().get_name() if e.get_type() == isl.ast_expr_type.id else None


def expr_args(e: isl.AstExpr, op: isl.ast_expr_op_type) -> list[isl.AstExpr] | None:
    """The arguments of an operation `op`, else None (another operation or no
    operation)."""
    if e.get_type() != isl.ast_expr_type.op or e.op_get_type() != op:
        return None
    return [e.op_get_arg(i) for i in range(e.op_get_n_arg())]


def sum_terms(e: isl.AstExpr) -> list[isl.AstExpr] | None:
    """The terms of a sum at the top of `e` (`e` itself when it is no sum); None when a
    subtraction, a negation or a negative constant makes some term negative."""
    kind = e.get_type()
    if kind == isl.ast_expr_type.int:
        return None if (expr_int(e) or 0) < 0 else [e]
    if kind != isl.ast_expr_type.op:
        return [e]
    op = e.op_get_type()
    if op in (isl.ast_expr_op_type.sub, isl.ast_expr_op_type.minus):
        return None
    if op != isl.ast_expr_op_type.add:
        return [e]
    terms: list[isl.AstExpr] = []
    for i in range(e.op_get_n_arg()):
        inner = sum_terms(e.op_get_arg(i))
        if inner is None:
            return None
        terms += inner
    return terms


def sym_expr(e: Sym) -> str:
    """A size expression in C (64-bit, floor division as isl means it)."""
    terms: list[str] = []
    for atom, c in e.terms:
        match atom:
            case str():
                text = size_name(atom)
            case FloorDiv(num=n, den=d):
                text = f"tc_floord({sym_expr(n)}, {d})"
            case MinOf(args=args) | MaxOf(args=args):
                fn = "tc_min" if isinstance(atom, MinOf) else "tc_max"
                text = sym_expr(args[0])
                for a in args[1:]:
                    text = f"{fn}({text}, {sym_expr(a)})"
        terms.append(text if c == 1 else f"{c} * {text}")
    if e.const or not terms:
        terms.append(str(e.const))
    return "(" + " + ".join(terms) + ")" if len(terms) > 1 else terms[0]
