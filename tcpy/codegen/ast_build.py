"""The isl AST of a schedule, with each statement's original indices as AST expressions.

isl's AST build calls back at each statement instance set; there the schedule is
inverted to express every index of the statement (in the domain's order) as an
expression of the loop iterators. The user node is annotated with an id whose name
keys the recorded expressions. At a pack mark (`tcpy.mapping.promotion`), the box
of each tensor it copies is computed over the loops outside the mark, its first
element expressed in their iterators, and the mark node annotated with it likewise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from tcpy.mapping import marks
from tcpy.mapping.promotion import box, footprint
from tcpy.poly.isl_helpers import isl_errors
from tcpy.poly.scop import Scop


@dataclass(frozen=True, eq=False, slots=True)
class UserStatement:
    statement: str  # the isl statement name (S<k> or I<k>)
    indices: tuple[isl.AstExpr, ...]  # one per domain dimension


@dataclass(frozen=True, eq=False, slots=True)
class PackedBox:
    """The box of a tensor a pack mark copies, in the loop iterators outside it."""

    tensor: str
    offsets: tuple[isl.AstExpr, ...]  # the box's first element, one per dimension
    sizes: tuple[int, ...]
    turns: int = 0  # how many of the tensor's innermost dimensions the copy holds first
    phases: int = 1  # in how many phases the copy holds the innermost dimension

    @property
    def held(self) -> tuple[int, ...]:
        """The extents of the copy: the box's, the innermost rounded up to whole phases
        (a scalar's box has none)."""
        if self.phases == 1 or not self.sizes:
            return self.sizes
        *outer, last = self.sizes
        return (*outer, -(-last // self.phases) * self.phases)


@dataclass(frozen=True, eq=False, slots=True)
class Ast:
    root: isl.AstNode
    statements: dict[str, UserStatement]  # by annotation id name
    packs: dict[str, tuple[PackedBox, ...]] = field(default_factory=dict)  # likewise
    split_scratch: bool = False  # a scratch mark was generated more than once (see below)

    def user(self, node: isl.AstNode) -> UserStatement:
        return self.statements[node.get_annotation().get_name()]

    def packed(self, mark: isl.AstNode) -> tuple[PackedBox, ...]:
        """The boxes a mark node copies (none for another mark)."""
        if not isinstance(marks.of_ast(mark), marks.Copy):
            return ()
        return self.packs[mark.get_annotation().get_name()]


def build_ast(
    scop: Scop, schedule: isl.Schedule, context: isl.Set | None = None, grouped: bool = False
) -> Ast:
    """The AST of `schedule`; `context` (default: the scop's) bounds the parameters.
    `grouped`: statements a band runs at the same time are generated as one piece (a
    row kernel's, all at the thread's row, stay under the marks above them once; isl
    otherwise generates each alone, with its own copy of those marks)."""
    ctx = scop.ctx
    ctx.reset_operations()
    ctx.set_ast_build_atomic_upper_bound(1)
    ctx.set_ast_build_detect_min_max(1)
    ctx.set_ast_build_group_coscheduled(int(grouped))
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

    packs: dict[str, tuple[PackedBox, ...]] = {}
    # isl generates a mark once per piece of the domain it splits the loops above into;
    # the pieces of a scratch mark would each lay out buffers that must be one
    scratch: list[str] = []

    def after_each_mark(node: isl.AstNode, build: isl.AstBuild) -> isl.AstNode:
        mark = marks.of_ast(node)
        if not isinstance(mark, marks.Copy):
            return node
        local = isinstance(mark, marks.Scratch)
        if local:
            scratch.append(mark.name)
        # a copy's box holds what is read below it; a scratch's, what is accessed
        accesses = scop.reads.union(scop.writes) if local else scop.reads
        boxes = []
        for tensor in mark.tensors:
            found = footprint(build.get_schedule(), accesses, tensor)
            b = None if found is None else box(found, tensor)
            if b is not None:
                offsets = tuple(build.expr_from_pw_aff(o) for o in b.offsets)
                pack = mark if isinstance(mark, marks.Pack) else marks.Pack(())
                boxes.append(
                    PackedBox(tensor, offsets, b.sizes, pack.turns(tensor), pack.phases(tensor))
                )
        key = f"P{len(packs)}"
        packs[key] = tuple(boxes)
        return node.set_annotation(isl.Id(key, context=ctx))

    with isl_errors(f"building the loop nest of {scop.cdef.name}"):
        build = isl.AstBuild.from_context(context if context is not None else scop.context)
        build, _callback = build.set_at_each_domain(at_each_domain)
        build, _after = build.set_after_each_mark(after_each_mark)
        root = build.node_from_schedule(schedule)
    return Ast(root, statements, packs, split_scratch=len(scratch) > len(set(scratch)))
