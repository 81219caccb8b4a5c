"""The isl AST of a schedule, with each statement's original indices as AST expressions.

isl's AST build calls back at each statement instance set; there the schedule is
inverted to express every index of the statement (in the domain's order) as an
expression of the loop iterators. The user node is annotated with an id whose name
keys the recorded expressions.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from tcpy.poly.isl_helpers import isl_errors
from tcpy.poly.scop import Scop


@dataclass(frozen=True, eq=False, slots=True)
class UserStatement:
    statement: str  # the isl statement name (S<k> or I<k>)
    indices: tuple[isl.AstExpr, ...]  # one per domain dimension


@dataclass(frozen=True, eq=False, slots=True)
class Ast:
    root: isl.AstNode
    statements: dict[str, UserStatement]  # by annotation id name

    def user(self, node: isl.AstNode) -> UserStatement:
        return self.statements[node.get_annotation().get_name()]


def build_ast(scop: Scop, schedule: isl.Schedule, context: isl.Set | None = None) -> Ast:
    """The AST of `schedule`; `context` (default: the scop's) bounds the parameters."""
    ctx = scop.ctx
    ctx.reset_operations()
    ctx.set_ast_build_atomic_upper_bound(1)
    ctx.set_ast_build_detect_min_max(1)
    statements: dict[str, UserStatement] = {}

    def at_each_domain(node: isl.AstNode, build: isl.AstBuild) -> isl.AstNode:
        inverse = isl.Map.from_union_map(build.get_schedule()).reverse()
        name = inverse.get_tuple_name(isl.dim_type.out)
        pma = isl.PwMultiAff.from_map(inverse)
        n = pma.dim(isl.dim_type.out)
        indices = tuple(build.expr_from_pw_aff(pma.get_pw_aff(i)) for i in range(n))
        key = f"U{len(statements)}"
        statements[key] = UserStatement(name, indices)
        return node.set_annotation(isl.Id(key, context=ctx))

    with isl_errors(f"building the loop nest of {scop.cdef.name}"):
        build = isl.AstBuild.from_context(context if context is not None else scop.context)
        build, _callback = build.set_at_each_domain(at_each_domain)
        root = build.node_from_schedule(schedule)
    return Ast(root, statements)
