"""Printing a register-blocked reduction (`tcpy.mapping.cpu.registers`): under a
`register_tile:RxV` mark, the block of outputs lives in a local array `tc_reg[R][V]`
across the reduction loops."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import NamedTuple

import islpy as isl

from tcpy.codegen.exprs import Read, StatementParts
from tcpy.codegen.isl_exprs import expr_args, expr_ids, expr_int, isl_expr
from tcpy.codegen.loops import FOR, Header, loop_depth
from tcpy.codegen.printer import Instance, Printer
from tcpy.errors import InternalError
from tcpy.mapping.marks import Mark, loop_marks, of_ast
from tcpy.parser import ast as tc


class UnprintedBlock(InternalError):
    """A fresh register block (`marks.RegisterBlock.fresh`) whose AST does not have a
    block's shape, or that has a parallel loop inside (`codegen.region`): printed as
    plain loops it would read outputs never initialised, so
    the kernel is printed again from the schedule without fresh blocks."""


def print_register_block(
    p: Printer,
    node: isl.AstNode,
    depth: int,
    marks: tuple[Mark, ...],
    sizes: list[int],
    across: bool = False,
    fresh: bool = False,
) -> bool:
    """Print a register-blocked reduction (`tcpy.mapping.cpu.registers`): the loops
    under the mark are the reduction loops, then one loop per blocked member, then
    (when the vector loop is a reduction) a lane loop, around one statement. The
    block of outputs lives in a local array across the reduction loops: loaded
    before them and stored after them, or, with lanes, a partial sum per lane
    started at the identity and added into the output at the end (TC lets a
    reduction be reassociated). `across` (`marks.RegisterBlock.across`): a block
    without lanes also starts at the identity, and is added into the output at the
    end. `fresh` (`marks.RegisterBlock.fresh`): the output's value before the block is
    the identity, never loaded. Returns False, printing nothing, when the AST does not
    have that shape."""
    shape = _shape(p, node, marks, sizes)
    if shape is None:
        return False
    plan, headers, lane_header, outer = shape
    plan = dataclasses.replace(plan, across=across and lane_header is None, fresh=fresh)
    block = [_Loop.of(h) for h in headers]
    lane = None if lane_header is None else _Loop.of(lane_header)
    blocked = [*headers, *([lane_header] if lane_header else [])]
    full = [full_tile(h, size) for h, size in zip(blocked, sizes, strict=True)]
    split = None  # a lane loop bounded by a reduction loop: constant bounds, guarded
    last = full[-1]
    if lane is not None and last is not None and not last.ids.isdisjoint(outer):
        one_path = _one_path(plan.parts, lane.iterator)
        innermost = plan.last_reduction
        peel = innermost if innermost and last.ids & outer == {innermost.id} else None
        peel = peel if peel is not None and _long(peel) else None
        guard = f"{lane.iterator} <= {last.edge}"
        split = _Split(last.loop, last.test, guard, one_path, lane, peel)
        full[-1] = FullTile(lane, "", frozenset())
    tests = [f.test for f in full if f is not None and f.test]
    if tests and all(f is not None for f in full):
        # a block inside the iteration domain (the common case) gets constant
        # bounds, which the compiler unrolls with the block in registers; a partial
        # block at an edge keeps the bounds isl gave (sizes read at each call)
        constant = [f.loop for f in full if f is not None]
        p.emit(depth, f"if ({' && '.join(tests)}) {{")
        lanes = constant[-1] if lane else None
        _print_block(p, plan, depth + 1, constant[: len(block)], lanes, split)
        masked = None if lane else _masked(p, plan, headers, full)
        if masked is not None:
            p.emit(depth, f"}} else if ({masked[1].worth}) {{")
            _print_block(p, masked[0], depth + 1, constant, None, mask=masked[1])
        p.emit(depth, "} else {")
        _print_block(p, plan, depth + 1, block, lane, split)
        p.emit(depth, "}")
    else:
        _print_block(p, plan, depth, block, lane, split)
    return True


class _Loop(NamedTuple):
    """A loop of a register block as printed: its iterator, start and header line."""

    iterator: str
    start: int | None
    init: str
    text: str

    @classmethod
    def of(cls, h: Header) -> _Loop:
        return cls(h.iterator, h.start, h.init, h.text)


def _shape(
    p: Printer, node: isl.AstNode, marks: tuple[Mark, ...], sizes: list[int]
) -> tuple[_Plan, list[Header], Header | None, frozenset[str]] | None:
    """The plan of a register block under a mark (`print_register_block`), its block
    loops, its lane loop and the reduction loops' iterators (isl ids); None when the
    AST does not have a register block's shape."""
    loops, node = _loops_down(node, marks)
    found = p.reduction_at(node)
    if found is None:
        return None
    source, values = found.source, found.values
    add = _BLOCK_COMBINE.get(source.op.reduction) if source.op.reduction else None
    if add is None:
        return None
    headers = [p.loop_header(loop) for loop, _ in loops]
    written = [found.element_uses(h.id) for h in headers]
    lane = headers[-1] if any(written) and not written[-1] else None
    body = headers[:-1] if lane else headers
    reductions = written.index(True) if True in written else len(body)
    block = body[reductions:]
    if not (
        block
        and all(written[reductions : len(body)])
        and len(block) + (lane is not None) == len(sizes)
        and (reductions > 0 or lane is not None)
        and all(h.step == 1 for h in headers[reductions:])
    ):
        return None
    outer = frozenset(h.id for h in headers[:reductions])
    if any(h.uses(*outer) for h in block):
        return None
    unrolled = [[f"#pragma GCC unroll {size}"] for size in sizes[: len(block)]]
    if lane is None:  # the last block loop is the vector loop
        here = loop_marks(loops[-1][1], loop_depth(loops[-1][0]))
        unrolled[-1] = p.pragmas(here, innermost=True, unroll=1)
    parts = p.bodies.parts(source, values, ids=found.ids())  # its reads' isl ids known
    steps = _steps(p, loops[:reductions], headers[:reductions], lane is None, parts)
    plan = _Plan(
        instance=found,
        parts=parts,
        add=add,
        sizes=sizes,
        unrolled=unrolled,
        vector=["#pragma omp simd"] if p.options.vectorize else [],
        reductions=steps,
        last_reduction=headers[reductions - 1] if reductions else None,
        inner=frozenset(h.id for h in headers),
        rows=frozenset(h.id for h in block[:-1]) if lane is None else frozenset(),
        steps=frozenset(h.id for h in headers[:reductions]),
    )
    return plan, block, lane, outer


def _loops_down(
    node: isl.AstNode, marks: tuple[Mark, ...]
) -> tuple[list[tuple[isl.AstNode, tuple[Mark, ...]]], isl.AstNode]:
    """The loops from `node` down, each with the marks around it, and the node below
    them."""
    loops: list[tuple[isl.AstNode, tuple[Mark, ...]]] = []
    while node.get_type() in (FOR, isl.ast_node_type.mark):
        if node.get_type() == FOR:
            loops.append((node, marks))
            node = node.for_get_body()
        else:
            mark = of_ast(node)
            assert mark is not None
            marks = (*marks, mark)
            node = node.mark_get_node()
    return loops, node


def _steps(
    p: Printer,
    loops: list[tuple[isl.AstNode, tuple[Mark, ...]]],
    headers: list[Header],
    vector: bool,
    parts: StatementParts,
) -> list[tuple[list[str], str]]:
    """The reduction loops' pragmas and headers. Around a vector loop's block the
    innermost keeps a loop: GCC unrolled a 3x3 convolution's 3 steps of kw and then
    loaded the image's vectors once per row of the block (44 loads per 36 FMAs
    instead of 24; 1.2-1.4x slower on a Zen 3); where an index divides (the phases of
    a strided copy), unrolled steps fold the division, and GCC decides."""
    steps = [
        (p.pragmas(loop_marks(marks, loop_depth(loop)), False, 1), h.text)
        for (loop, marks), h in zip(loops, headers, strict=True)
    ]
    if vector and steps and not any(_divides(r.index) for r in parts.reads):
        steps[-1] = ([*steps[-1][0], "#pragma GCC unroll 1"], steps[-1][1])
    return steps


@dataclass(frozen=True)
class _Plan:
    """What a register block prints, whatever its loops' bounds."""

    instance: Instance
    parts: StatementParts
    add: str  # how two partial results combine
    sizes: list[int]
    unrolled: list[list[str]]  # the pragmas of each block loop
    vector: list[str]  # the pragmas of the lane loop
    reductions: list[tuple[list[str], str]]  # the reduction loops: pragmas, header
    last_reduction: Header | None  # the innermost reduction loop
    # the isl ids of the loops under the mark, of the block loops other than a vector
    # loop (none where the block has lanes), and of the reduction loops
    inner: frozenset[str] = frozenset()
    rows: frozenset[str] = frozenset()
    steps: frozenset[str] = frozenset()
    across: bool = False  # started at the identity, added in at the end (`RegisterBlock`)
    fresh: bool = False  # the output holds the identity before the block (`RegisterBlock`)

    def before(self, parts: StatementParts) -> str:
        """The output's value before the block: loaded, or the identity where fresh."""
        return parts.identity if self.fresh else parts.current


class _Mask(NamedTuple):
    """How a block at an edge of the domain prints under constant bounds (`_masked`):
    the test that an element of the block is inside the domain, and the guarded loads
    that its rows share, each into a local array before the rows (`(local, fill)`)."""

    test: str
    shared: list[tuple[str, str]]
    worth: str  # the test that the block is half inside the domain or more, along each loop


def _masked(
    p: Printer, plan: _Plan, headers: list[Header], full: list[FullTile | None]
) -> tuple[_Plan, _Mask] | None:
    """A block at an edge of the domain (its loops' tiles partly outside it) printed as
    a whole one, under constant bounds, in registers: the plan whose loads at elements
    of the block outside the domain read nothing (`(c <= edge) ? load : 0`, masked
    loads once vectorised), the loads that do not move with the block's rows read once
    per reduction step into a local array (GCC did not share the masked loads between
    the rows: 2x slower than isl's bounds), and the `_Mask`. The elements outside the
    domain compute values of no meaning, never stored; those inside, what the general
    path computes, in the same order. None where that is not safe: a value not in
    floating point (an integer division by the 0 of an element outside would trap),
    a load checked on the data, or hoisted before the value, or in another's
    subscripts. With isl's bounds the block lives in memory: a block of 8 x 32 whose
    tiles of 144 columns end in 16 (an 800 x 1000 x 900 matmul) ran the whole matmul
    2.3x slower than tiles of 128; masked, a 37 x 300 x 53 matmul (blocks of 5 of 8
    rows and 21 of 32 columns at the edges) 59 -> 31 us, 777 x 555 x 333 2.5 -> 2.1 ms.
    A block less than half inside along a loop keeps isl's bounds (`_Mask.worth`):
    masked, the 4 columns of 32 at the edge of 64 x 512 x 100 took the time of 32 (the
    matmul 45 -> 64 us)."""
    edges = {
        h.id: f"{f.loop.iterator} <= {f.edge}"
        for h, f in zip(headers, full, strict=False)
        if f is not None and f.test
    }
    worth = " && ".join(
        f"{f.edge} >= {(size + 1) // 2 - 1}"
        for f, size in zip(full, plan.sizes, strict=False)
        if f is not None and f.test
    )
    instance, parts = plan.instance, plan.parts
    if not parts.floating or parts.prelude:
        return None
    if any(r.checked or r.nested or r.gathers or not r.plain for r in parts.reads):
        return None
    rows = {h.id for h in headers[:-1]}
    vector = full[-1]
    assert vector is not None
    guarded: dict[str, str] = {}
    shared: list[tuple[str, str]] = []
    for r in parts.reads:
        guard = [test for id_, test in edges.items() if id_ in r.ids]
        if not guard or r.text in guarded:  # a read twice: one load for both
            continue
        masked = f"(({' && '.join(guard)}) ? {r.text} : 0)"
        if rows.isdisjoint(r.ids):
            local = f"tc_m{len(shared)}"
            shared.append((local, f"{local}{_offset(vector.loop)} = {masked};"))
            guarded[r.text] = f"{local}{_offset(vector.loop)}"
        else:
            guarded[r.text] = masked
    masked_parts = p.bodies.parts(instance.source, instance.values, substitute=guarded)
    mask = _Mask(" && ".join(edges.values()), shared, worth)
    return dataclasses.replace(plan, parts=masked_parts), mask


def _print_block(
    p: Printer,
    plan: _Plan,
    depth: int,
    block: list[_Loop],
    lane: _Loop | None,
    split: _Split | None = None,
    mask: _Mask | None = None,
) -> None:
    """The block of outputs loaded (or, with lanes, started at the identity), updated
    across the reduction loops, and stored, with `block` and `lane` as its loops.
    With `split` (the lane loop's full tile, the test that it runs whole and the guard
    of a lane, where a reduction loop bounds the lanes: rows of 30 in lanes of 16),
    every tile runs the lane loop under constant bounds, its lanes past the row
    adding the identity (masked loads): indexed only by constants, the block stays
    in registers (a weight gradient's block, indexed by a variable lane bound, lived
    in memory: 6x slower; with the full tiles on a path of their own, or the partial
    tile's update under an `if`, it lived in memory too: 1.55 against 1.2-1.3 ms); a
    reduction loop of PEELED_STEPS steps or more is peeled instead (`_peeled`). With
    `mask` (`_masked`), only the elements where it holds are loaded and stored."""
    parts, sizes = plan.parts, plan.sizes
    levels = [(pragmas, h.text) for pragmas, h in zip(plan.unrolled, block, strict=True)]
    index = "".join(_offset(h) for h in block)
    arrays = ["tc_reg"]
    p.emit(depth, "{")
    # each row of the block a power of two long: GCC 12.2 at -O3 miscomputed a block of
    # rows of 7 lanes whose rows it unrolled (`tc_reg[2][3][7]`, a bfloat16 contraction
    # from the fuzzer) and got it right with rows of 8; the extra elements are not used
    declared = [*sizes[:-1], 1 << (sizes[-1] - 1).bit_length()]
    for array in arrays:
        p.emit(depth + 1, f"{parts.compute} {array}{''.join(f'[{n}]' for n in declared)};")
    if lane is None:
        _print_outputs(p, plan, depth + 1, levels, f"tc_reg{index}", mask)
    else:
        _print_lanes(p, plan, depth + 1, levels, index, arrays, lane, split)
    p.emit(depth, "}")


def _print_outputs(
    p: Printer,
    plan: _Plan,
    depth: int,
    levels: list[tuple[list[str], str]],
    element: str,
    mask: _Mask | None,
) -> None:
    """A block without lanes (`_print_block`): its `element` of `tc_reg` loaded from
    the output (or, `plan.across`, started at the identity), updated across the
    reduction loops and stored (added in), the block loops `levels` around each."""
    parts, sizes = plan.parts, plan.sizes
    test = mask.test if mask else ""
    start = plan.before(parts)
    current = f"({test}) ? {start} : {parts.identity}" if test and not plan.fresh else start
    # the loads and stores not `omp simd` loops (GCC unrolls and vectorises them
    # anyway): GCC 12 vectorised those on their own and then kept 3 of a 6 x 16
    # block's 12 vectors in memory across the reduction loops (a 512^3 matmul on
    # AVX2: 3.4 -> 6.3 ms); `GCC unroll` on them compiled 1.3x slower
    moves = [*levels[:-1], ([], levels[-1][1])]
    if plan.across:
        # each of the output's rows once, in turn: a 6 x 16 block of a strided
        # convolution, whose 16 rows 4 KB apart share a set of the L1 cache, loaded
        # at the start and stored at the end ran 1.9 ms against 0.99 started at zero
        # and stored row after row (1.03 added in so)
        _nest(p, depth, moves, [f"{element} = {parts.identity};"])
        moves = [([], levels[-1][1]), *levels[:-1]]
        current = parts.merge(plan.before(parts), element)
    else:
        _nest(p, depth, moves, [f"{element} = {current};"])
        current = element
    based = parts if mask else _rebased(p, plan, depth)
    update = [based.wrap(f"{element} = {based.combine(element)};")]
    if mask and mask.shared:
        inside = depth + len(plan.reductions)
        _open(p, depth, plan.reductions)
        p.emit(inside, "{")
        for local, _ in mask.shared:
            p.emit(inside + 1, f"{parts.compute} {local}[{sizes[-1]}];")
        _nest(p, inside + 1, levels[-1:], [fill for _, fill in mask.shared])
        _nest(p, inside + 1, levels, update)
        p.emit(inside, "}")
        _close(p, depth, len(plan.reductions))
    else:
        _nest(p, depth, [*plan.reductions, *levels], update)
    store = f"{parts.target} = {parts.store(current)};"
    _nest(p, depth, moves, [f"if ({test}) {store}" if test else store])


def _rebased(p: Printer, plan: _Plan, depth: int) -> StatementParts:
    """The statement's parts reading the block's broadcast loads through pointers
    (`_bases`), the pointers declared at `depth`."""
    bases, parts = _bases(p, plan)
    for line in bases:
        p.emit(depth, line)
    return parts


def _bases(p: Printer, plan: _Plan) -> tuple[list[str], StatementParts]:
    """Pointers to where the block's broadcast loads start, declared before the
    reduction loops, and the statement's parts reading through them: a load that
    each row of the block reads apart and that moves with loops above the mark reads
    `<array>_rows[inner]`, the pointer at its element at the first step of the loops
    under the mark. GCC then addresses the rows from one register at constant
    offsets; with an address per row, a 6 x 16 block over rows 4,800 bytes apart
    kept three of them on the stack, reloaded at each step (a 1000 x 1200 x 1100
    matmul 1.3x slower on a Zen 3, a 1000 x 1100 x 1200 gemm 1.3x). Loads whose index
    is not affine in the loop iterators keep their text."""
    instance, inner, parts = plan.instance, plan.inner, plan.parts
    if parts.prelude or not all(_affine(e) for e in instance.exprs.values()):
        return [], plan.parts
    outer = frozenset().union(*(r.ids for r in parts.reads)) - inner

    def at_zero(ids: frozenset[str]) -> tuple[Read, ...]:
        """The loads with the iterators `ids` at 0."""
        zeroed = p.instance(instance.user, {i: "0" for i in ids})
        return p.bodies.parts(zeroed.source, zeroed.values).reads

    views = zip(parts.reads, at_zero(inner), at_zero(outer), at_zero(inner | outer), strict=True)
    bases: list[str] = []
    substitute: dict[str, str] = {}
    per_array: dict[str, int] = {}  # pointers into each array so far
    for read, start, step, origin in views:
        plain = read.plain and not (read.checked or read.nested or read.gathers or read.hoisted)
        # a load each row of the block reads apart (a broadcast), moving with loops above
        under = read.ids & inner
        moves = not under.isdisjoint(plan.rows) and under <= plan.rows | plan.steps
        moves = moves and not read.ids <= inner
        if (
            not plain
            or not moves
            or _calls(read.index)
            or read.text != f"{read.array}[{read.index}]"
        ):
            continue
        if read.text in substitute:  # a read twice: one pointer for both
            continue
        taken = per_array[read.array] = per_array.get(read.array, -1) + 1
        name = f"{read.array}_rows{taken or ''}"
        bases.append(f"__typeof__(&{read.array}[0]) {name} = &{read.array}[{start.index}];")
        substitute[read.text] = f"{name}[({step.index}) - ({origin.index})]"
    if not bases:
        return [], plan.parts
    return bases, p.bodies.parts(instance.source, instance.values, substitute=substitute)


def _divides(index: str) -> bool:
    """Whether a printed index divides (a copy's phases of a strided read)."""
    return "tc_floord(" in index or " % " in index or " / " in index


def _calls(index: str) -> bool:
    """Whether a printed index calls a function or divides: not a sum of products."""
    return _divides(index) or re.search(r"[A-Za-z_]\w*\(", index) is not None


def _affine(e: isl.AstExpr) -> bool:
    """Whether an isl expression is a sum of iterators (or parameters) times integers."""
    kind = e.get_type()
    if kind in (isl.ast_expr_type.id, isl.ast_expr_type.int):
        return True
    op, args = e.op_get_type(), [e.op_get_arg(i) for i in range(e.op_get_n_arg())]
    if op in (isl.ast_expr_op_type.add, isl.ast_expr_op_type.sub, isl.ast_expr_op_type.minus):
        return all(_affine(a) for a in args)
    if op == isl.ast_expr_op_type.mul:
        return any(expr_int(a) is not None for a in args) and all(_affine(a) for a in args)
    return False


def _print_lanes(
    p: Printer,
    plan: _Plan,
    depth: int,
    levels: list[tuple[list[str], str]],
    index: str,
    arrays: list[str],
    lane: _Loop,
    split: _Split | None,
) -> None:
    """A block with a lane loop (`_print_block`): its `arrays` of partial results per
    lane started at the identity, updated across the reduction loops (the full tiles
    of lanes apart where `split`), and merged into the outputs."""
    parts = plan.parts
    lanes = f"for (int tc_l = 0; tc_l < {plan.sizes[-1]}; tc_l++) {{"
    start = [
        line for a in arrays for line in (lanes, f"  {a}{index}[tc_l] = {parts.identity};", "}")
    ]
    _nest(p, depth, levels, start)
    inside = depth + len(plan.reductions)
    if split is not None and split.peel is not None:
        _open(p, depth, plan.reductions[:-1])
        _peeled(p, plan, inside - 1, levels, f"tc_reg{index}", split, split.peel)
        _close(p, depth, len(plan.reductions) - 1)
    else:
        _open(p, depth, plan.reductions)
        if split is None:
            _lane_update(p, plan, inside, levels, f"tc_reg{index}", lane)
        elif split.one_path:  # the lanes past the row add the identity
            _lane_update(p, plan, inside, levels, f"tc_reg{index}", split.loop, split.guard, True)
        else:
            p.emit(inside, f"if ({split.test}) {{")
            _lane_update(p, plan, inside + 1, levels, f"tc_reg{index}", split.loop)
            p.emit(inside, "} else {")
            _lane_update(p, plan, inside + 1, levels, f"tc_reg{index}", split.loop, split.guard)
            p.emit(inside, "}")
        _close(p, depth, len(plan.reductions))
    # the lanes' partial results, merged in a tree of vector steps: a chain of
    # scalar steps took as long as the reduction loop on short reductions
    merge = [f"#pragma omp simd reduction({plan.add}:tc_sum)"] if plan.vector else []
    finish = [f"{parts.compute} tc_sum = {plan.before(parts)};"]
    for a in arrays:
        finish += [*merge, lanes, f"  tc_sum = tc_sum {plan.add} {a}{index}[tc_l];", "}"]
    finish.append(f"{parts.target} = {parts.store('tc_sum')};")
    _nest(p, depth, levels, finish)


def _peeled(
    p: Printer,
    plan: _Plan,
    depth: int,
    levels: list[tuple[list[str], str]],
    block: str,
    split: _Split,
    loop: Header,
) -> None:
    """The innermost reduction `loop`, whose steps bound the lanes (`split`), in two
    runs of one iterator: its first steps, as long as their tiles of lanes are whole,
    unguarded; then the rest, its lanes one at a time under isl's bounds (correct
    whatever steps the first run took). A row dot product at 2100 (131 tiles of 16
    and one of 4), with every step's lanes guarded: 211-250 us; peeled: 150-158. The
    rest's lanes vectorised under a mask made GCC keep the block in memory and sum
    its lanes one by one: gesummv at 1300 x 1300, 98 us; one at a time, 88."""
    pragmas = plan.reductions[-1][0]
    step = f"{loop.iterator}++" if loop.inc == "1" else f"{loop.iterator} += {loop.inc}"
    p.emit(depth, "{")
    p.emit(depth + 1, f"{loop.index_type} {loop.iterator} = {loop.init};")
    for pragma in pragmas:
        p.emit(depth + 1, pragma)
    p.open_loop(depth + 1, f"for (; ({loop.cond}) && ({split.test}); {step}) {{")
    _lane_update(p, plan, depth + 2, levels, block, split.loop)
    p.emit(depth + 1, "}")
    p.open_loop(depth + 1, f"for (; {loop.cond}; {step}) {{")
    _lane_update(p, plan, depth + 2, levels, block, split.rest, vector=False)
    p.emit(depth + 1, "}")
    p.emit(depth, "}")


PEELED_STEPS = 4
"""Steps of a reduction loop bounding the lanes from which it is peeled (`_peeled`):
a weight gradient's rows of 30 (a whole tile of 16 lanes and a partial one) ran 5%
slower peeled, its block's two paths each run once."""


def _long(loop: Header) -> bool:
    """Whether `loop` takes PEELED_STEPS steps or more (or a number known only at run
    time)."""
    start, last, step = loop.start, loop.last(), loop.step
    if start is None or last is None or not step:
        return True
    return (last - start) // step + 1 >= PEELED_STEPS


def _lane_update(
    p: Printer,
    plan: _Plan,
    depth: int,
    levels: list[tuple[list[str], str]],
    block: str,
    lane: _Loop,
    guard: str = "",
    one_path: bool = False,
    vector: bool = True,
) -> None:
    """The block loops and lane loop `lane` around one update of array `block`'s lane,
    only where `guard` holds if one is given: on `one_path` (`_one_path`) the update
    adds the identity elsewhere, else it is skipped under an `if`; the lane loop
    vectorised unless `vector` is False."""
    parts = plan.parts
    element = f"{block}{_offset(lane)}"
    if guard and one_path:
        added = f"(({guard}) ? ({parts.value}) : {parts.identity})"
        body = [f"{element} = {parts.merge(element, added)};"]
    else:
        update = parts.wrap(f"{element} = {parts.combine(element)};")
        body = [f"if ({guard}) {{", f"  {update}", "}"] if guard else [update]
    _nest(p, depth, [*levels, (plan.vector if vector else [], lane.text)], body)


def _nest(p: Printer, depth: int, levels: list[tuple[list[str], str]], body: list[str]) -> None:
    """Loops (their pragmas and headers, outermost first) around `body`."""
    _open(p, depth, levels)
    for line in body:
        p.emit(depth + len(levels), line)
    _close(p, depth, len(levels))


def _open(p: Printer, depth: int, levels: list[tuple[list[str], str]]) -> None:
    """Open loops (their pragmas and headers, outermost first) from `depth` in."""
    for k, (pragmas, header) in enumerate(levels):
        for pragma in pragmas:
            p.emit(depth + k, pragma)
        p.open_loop(depth + k, header)


def _close(p: Printer, depth: int, count: int) -> None:
    """Close `count` loops opened from `depth` in."""
    for k in reversed(range(count)):
        p.emit(depth + k, "}")


_BLOCK_COMBINE = {tc.Reduction.SUM: "+", tc.Reduction.PROD: "*"}
"""How two partial results of a blocked reduction combine."""


class _Split(NamedTuple):
    """A lane loop bounded by a reduction loop (`print_register_block`): its loop
    under constant bounds, the test that a tile of lanes runs whole, the guard of a
    lane, and whether whole and partial tiles run on one path (`_one_path`)."""

    loop: _Loop
    test: str
    guard: str
    one_path: bool
    rest: _Loop  # the lane loop under isl's bounds (`_peeled`'s last steps)
    peel: Header | None = None  # the reduction loop to peel (`_peeled`), if one is


def _one_path(parts: StatementParts, lane: str) -> bool:
    """Whether a guarded lane update can add `value` under a `?:` (the identity past
    the row), on the path of the whole tiles: no load hoisted before the value (it
    would leave the guard), and every load indexed by the lane loop's iterator `lane`.
    GCC vectorises the `?:` with masked loads, but a load the lanes share (`alpha`
    in `alpha * A(i, j) * x(j)`) left the loop scalar: 7x slower."""
    indexed = re.compile(rf"\b{re.escape(lane)}\b")
    return not parts.prelude and all(indexed.search(r.index) for r in parts.reads)


class FullTile(NamedTuple):
    """A block loop with a constant bound (`full_tile`): the loop, the test under
    which its iterations are all in the domain ("" when isl's bound is constant
    already), the isl ids the test uses, and isl's edge (`c <= edge` keeps an
    iteration in the domain; "" with no test)."""

    loop: _Loop
    test: str
    ids: frozenset[str]
    edge: str = ""


def full_tile(loop: Header, size: int) -> FullTile | None:
    """A block loop of `size` iterations with a constant bound (`FullTile`); None when its
    bound is of another form (the block's `c <= last`, or the least of `last` and an
    edge: `c <= min(last, e)`)."""
    found = loop.bound()
    if loop.start != 0 or found is None or not found[0]:
        return None
    last, bound = size - 1, found[1]
    if expr_int(bound) == last:
        return FullTile(_Loop.of(loop), "", frozenset())
    args = expr_args(bound, isl.ast_expr_op_type.min)
    if args is None or len(args) != 2 or expr_int(args[0]) != last:
        return None
    full = _Loop(loop.iterator, 0, loop.init, loop.with_cond(f"{loop.iterator} <= {last}"))
    edge = isl_expr(args[1], loop.names)
    return FullTile(full, f"{edge} >= {last}", expr_ids(args[1]), edge)


def _offset(loop: _Loop) -> str:
    """A loop's position in a block array: its iterator less its start."""
    return f"[{loop.iterator}]" if loop.start == 0 else f"[{loop.iterator} - ({loop.init})]"
