"""Register tiles of a thread on the GPU (`use_private_memory`): the outputs a thread
computes one after another, which the mapping marks on its point loops
(`tcpy.mapping.marks.ThreadRegisters`, with the most registers it may hold), read from the
isl AST under that mark (`find_thread_tile`) and printed as a register array kept
across their reduction (`print_thread_tile`), each step combining all of them, the
operand values they share loaded once (as vectors where they are adjacent:
`tcpy.codegen.thread_vectors`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import islpy as isl

from tcpy.codegen.dialect import CUDA
from tcpy.codegen.exprs import Read, StatementParts
from tcpy.codegen.isl_exprs import expr_args, expr_id, expr_ids, expr_int, sum_terms
from tcpy.codegen.loops import FOR, IF, Header
from tcpy.codegen.printer import Instance, Printer
from tcpy.codegen.thread_vectors import (
    VECTOR_ELEMENTS,
    Strided,
    array_type,
    combination,
    declare_indices,
    loop_steps,
    open_steps,
    read_runs,
    read_steps,
    run_access,
    step_value,
    steps_run,
)
from tcpy.mapping.gpu import MappedKernel
from tcpy.mapping.marks import Mark, Shared, ThreadRegisters, of_ast
from tcpy.naming import THREAD_PARAMS
from tcpy.poly.isl_helpers import list_items
from tcpy.poly.scop import Kind
from tcpy.types import ScalarType


@dataclass(frozen=True)
class ThreadTile:
    """The outputs a thread computes one after another (`find_thread_tile`): the loops
    strided by the block around the loops of their reduction, and the statement."""

    strided: tuple[Strided, ...]
    reductions: tuple[Header, ...]  # outermost first
    instance: Instance
    parts: StatementParts
    # the nest initialises each output first (`initialisation`): it starts at the
    # identity in its register, and is never loaded
    initialised: bool = False
    # the innermost reduction loop's steps taken at a time (`ThreadRegisters.steps`)
    steps: int = 1


@dataclass
class Held:
    """A register tile held across loops enclosing its reduction nest, being printed:
    those loops' iterators (isl ids), and the tile once its nest is found."""

    iterators: list[str]
    tile: ThreadTile | None = None


@dataclass
class ThreadPrinter(Printer):
    """A printer of the code each GPU thread runs (`tcpy.codegen.cuda.CudaPrinter` is
    one): the kernel it belongs to, the reduction the thread shares with other lanes
    while one is printed, and the register tile held across loops while a `private`
    mark's code is printed."""

    kernel: MappedKernel | None = None
    lane_parts: StatementParts | None = None  # inside a partial reduction: what it reduces
    held: Held | None = None  # under a `private` mark: the register tile held there
    sunk: list[str] = field(default_factory=list)  # guards moved into a shared copy
    divergent: int = 0  # loops and guards on threadIdx.x around the code being printed
    # the barrier of the kernel's threads (`tcpy.codegen.one_kernel.barrier` where the
    # kernel is a part of one kernel), and the shared memory its code declares, bytes;
    # `shared_pool`: the kernel's arrays are places in the one kernel's `tc_pool`
    barrier: str = "__syncthreads();"
    shared_bytes: int = 0
    shared_pool: bool = False

    def declare_shared(self, depth: int, scalar: ScalarType, buffer: str, count: int) -> None:
        """Declares `buffer`, `count` elements of `scalar` in the block's shared memory,
        aligned for 16-byte accesses: an array of its own, or the next place in the
        one kernel's pool (`tcpy.codegen.one_kernel`), an array all the same."""
        ctype = CUDA.ctype(scalar)
        if not self.shared_pool:
            self.emit(depth, f"__shared__ __align__(16) {ctype} {buffer}[{count}];")
            self.shared_bytes += count * scalar.dtype.itemsize
            return
        at = -(-self.shared_bytes // 16) * 16
        array = f"{ctype} (*)[{count}]"
        self.emit(
            depth, f"{ctype} (&{buffer})[{count}] = *reinterpret_cast<{array}>(tc_pool + {at});"
        )
        self.shared_bytes = at + count * scalar.dtype.itemsize


def strided_loop(loop: Header, kernel: MappedKernel | None) -> Strided | None:
    """`loop` as a loop strided by the block, when it is one of constant bounds (it
    starts at a thread index and steps by at least the block's threads along it), or
    as a thread's run of adjacent values in a kernel that has them
    (`MappedKernel.runs`: `c = 2 * threadIdx.x; c <= 2 * threadIdx.x + 1`)."""
    init = loop.node.for_get_init()
    if kernel is not None and kernel.runs > 1 and THREAD_PARAMS[0] in expr_ids(init):
        return _run_loop(loop, kernel.runs)
    first = expr_id(init)
    found = loop.bound()
    if first not in THREAD_PARAMS or found is None or kernel is None:
        return None
    inclusive, bound = found
    constant = expr_int(bound)
    args = expr_args(bound, isl.ast_expr_op_type.min)
    partial = constant is None and args is not None and len(args) == 2  # the last tile
    limit = expr_int(args[0]) if partial and args is not None else constant
    step = loop.step
    if limit is None or limit < 0 or step is None or step < 0:
        return None
    last = limit - (not inclusive)
    axis = THREAD_PARAMS.index(first)
    threads = kernel.block[axis] if axis < len(kernel.block) else 1
    if step < 1 or threads > step:
        return None
    trips = last // step + 1
    whole = constant is not None and threads == step and trips * step - 1 <= last
    return Strided(loop, loop.init, step, trips, whole)


def _run_loop(loop: Header, runs: int) -> Strided | None:
    """`loop` as a thread's whole run of `runs` adjacent values from `runs *
    threadIdx.x` (the mapping gives runs only where the tiles divide the loop);
    None for any other loop."""
    init = loop.node.for_get_init()
    found = loop.bound()
    if loop.step != 1 or not _run_start(init, runs) or found is None or not found[0]:
        return None
    last = expr_args(found[1], isl.ast_expr_op_type.add)
    if last is None or len(last) != 2 or not _run_start(last[0], runs):
        return None
    if expr_int(last[1]) != runs - 1:
        return None
    return Strided(loop, f"({loop.init})", 1, runs, True)


def _run_start(e: isl.AstExpr, runs: int) -> bool:
    """Whether `e` is `runs * threadIdx.x` (`t0`)."""
    args = expr_args(e, isl.ast_expr_op_type.mul)
    return (
        args is not None
        and len(args) == 2
        and expr_int(args[0]) == runs
        and expr_id(args[1]) == THREAD_PARAMS[0]
    )


@dataclass
class StepLoads:
    """The loads of a step of a thread tile's reduction made once for all its outputs
    (`_step_loads`), and the step (`tc_acc[tc_j] = ...`) reading them from locals."""

    shared: list[Read]  # `tc_o<k>`: no output of the thread's changes them
    along: list[Read]  # `tc_r<k>[...]`: only the thread's run changes them
    # `tc_k<k>[...][tc_u]`: loaded for the tile's steps at a time, with the strided loops
    # each uses (`tcpy.codegen.thread_vectors.read_steps`)
    stepped: list[tuple[Read, tuple[Strided, ...]]]
    step: str


def _step_loads(printer: ThreadPrinter, tile: ThreadTile) -> StepLoads:
    """The loads of a step of `tile`'s reduction that no output of the thread's changes
    (B's value at k, shared by a column of outputs), those only the thread's run
    changes (`run_of`: B's values at k along the run, read as one vector), and, where
    the tile takes its innermost reduction loop several steps at a time, those that
    change along it (A's values at k..k+3 for each of the thread's rows, read as one
    vector each): each loaded into locals once per step (per steps) instead. Only
    where every output of the tile runs the step unconditionally: a load under `?:`,
    `&&` or `||`, or in a thread that lacks some outputs, may not be made where it
    was not."""
    parts = tile.parts
    if not all(s.whole for s in tile.strided) or parts.conditional:
        return StepLoads([], [], [], parts.wrap(f"tc_acc[tc_j] = {parts.combine('tc_acc[tc_j]')};"))
    run = run_of(tile)
    names = {s.loop.id for s in tile.strided}
    loads = StepLoads([], [], [], "")
    taken: dict[int, Read] = {}  # by position in `parts.reads`
    for k in _in_text_order(parts.reads):
        r = parts.reads[k]
        if _within_taken(parts.reads, k, taken) or any(t.text == r.text for t in taken.values()):
            continue  # a gather's index, read with it, or a read taken already
        used = names & r.ids
        if run is not None and used == {run.loop.id}:
            loads.along.append(r)
        elif _steps_along(printer, tile, r):
            loads.stepped.append((r, tuple(s for s in tile.strided if s.loop.id in used)))
        elif not used:
            loads.shared.append(r)
        else:
            continue
        taken[k] = r
    substitute = {r.text: f"tc_o{k}" for k, r in enumerate(loads.shared)}
    trips = run.trips if run else 1
    substitute |= {r.text: f"tc_r{k}[tc_j % {trips}]" for k, r in enumerate(loads.along)}
    for k, (r, used_loops) in enumerate(loads.stepped):
        substitute[r.text] = f"tc_k{k}[{combination(tile.strided, used_loops, 'tc_j')}][tc_u]"
    instance = tile.instance
    shared = printer.bodies.parts(
        instance.source, instance.values, ids=instance.ids(), substitute=substitute
    )
    loads.step = shared.wrap(f"tc_acc[tc_j] = {shared.combine('tc_acc[tc_j]')};")
    return loads


def _steps_along(printer: ThreadPrinter, tile: ThreadTile, read: Read) -> bool:
    """Whether `read` is loaded for the tile's steps at a time: the tile takes several,
    the read changes along them, with an affine, unchecked index of its own (no
    gather) into an array of a vector type other than the output's."""
    if tile.steps == 1 or tile.reductions[-1].id not in read.ids:
        return False
    if read.gathers or read.nested or read.checked or not read.plain:
        return False
    return read.array != tile.parts.array and array_type(printer, read.array) in VECTOR_ELEMENTS


def _in_text_order(reads: tuple[Read, ...]) -> list[int]:
    """The positions of `reads` (in the order they were printed: a gather's index
    before the read around it) in the order they stand in the step's text: the
    declarations of the reads loaded into locals first (`Read.hoisted`, once each),
    then the others, each read before the reads of its subscripts."""

    def subtree(k: int) -> list[int]:
        inner = [j for j in range(k) if reads[j].within == k]
        return [k, *(j for i in inner for j in subtree(i))]

    tops = [k for k, r in enumerate(reads) if r.within is None]
    declared: list[int] = []
    for k in tops:
        if reads[k].hoisted and all(reads[j].text != reads[k].text for j in declared):
            declared.append(k)
    rest = [k for k in tops if not reads[k].hoisted]
    return [j for k in (*declared, *rest) for j in subtree(k)]


def _within_taken(reads: tuple[Read, ...], k: int, taken: dict[int, Read]) -> bool:
    """Whether read `k` lies in the subscripts of a read already taken."""
    outer = reads[k].within
    while outer is not None:
        if outer in taken:
            return True
        outer = reads[outer].within
    return False


def run_of(tile: ThreadTile) -> Strided | None:
    """The thread's run of adjacent outputs (`MappedKernel.runs`), when it is the tile's
    innermost loop and whole: each output's element then follows the one before."""
    last = tile.strided[-1]
    return last if last.step == 1 and last.trips in (2, 4) and last.whole else None


def _alone_in_some(name: str, names: set[str], subscripts: list[isl.AstExpr]) -> bool:
    """Whether some subscript is the iterator `name`, or `name` added to terms that
    use none of `names`: distinct values of it then reach distinct elements."""
    for sub in subscripts:
        terms = sum_terms(sub)
        if terms is None or not any(expr_id(t) == name for t in terms):
            continue
        others = [t for t in terms if expr_id(t) != name]
        if all(expr_ids(t).isdisjoint(names) for t in others):
            return True
    return False


def find_thread_tile(
    printer: ThreadPrinter, node: isl.AstNode, outputs: int, steps: int = 1
) -> ThreadTile | None:
    """The outputs a thread computes one after another, to be kept in registers
    across their reduction instead (under a `ThreadRegisters` mark of `outputs`): no more
    than `outputs` of them, from a perfect nest of loops
    strided by the block (`c3 = threadIdx.y; c3 <= 31; c3 += 8`), of constant trip
    counts, around a perfect nest of reduction loops (a convolution's c, kh, kw)
    whose innermost body is one reduction statement into an element none of them
    changes (or its initialisation at their first iteration, then it: the tile then
    starts at the identity, `initialisation`), each strided loop's index added alone
    to some subscript of that
    element (so that every iteration has an element of its own), and no bound of
    a reduction loop using them. Each output is then combined in the order it was.
    None for any other loop."""
    if printer.lane_parts is not None:
        return None
    strided: list[Strided] = []
    while node.get_type() == FOR:
        loop = printer.loop_header(node)
        found = strided_loop(loop, printer.kernel)
        if found is None:
            break
        strided.append(found)
        node = node.for_get_body()
    reductions: list[Header] = []
    while node.get_type() == FOR:
        reductions.append(printer.loop_header(node))
        node = node.for_get_body()
    update = initialisation(printer, node, reductions)
    reduced = printer.reduction_at(node if update is None else update)
    if not strided or not reductions or reduced is None:
        return None
    if math.prod(s.trips for s in strided) > outputs:
        return None
    names = {s.loop.id for s in strided}
    if any(r.uses(*names) for r in reductions):
        return None
    # The registers are loaded and stored where the reduction nest runs at all:
    # each loop's first test, exact when no bound uses an enclosing loop's index.
    for k, r in enumerate(reductions):
        if r.uses(*(outer.id for outer in reductions[:k])):
            return None
    if reduced.element_uses(*(r.id for r in reductions)):
        return None
    subscripts = [reduced.exprs[v] for v in reduced.source.indices]
    if not all(_alone_in_some(n, names, subscripts) for n in names):
        return None
    parts = printer.bodies.parts(reduced.source, reduced.values, ids=reduced.ids())
    steps = loop_steps(reductions[-1], steps)
    return ThreadTile(tuple(strided), tuple(reductions), reduced, parts, update is not None, steps)


def initialisation(
    printer: ThreadPrinter, node: isl.AstNode, reductions: list[Header]
) -> isl.AstNode | None:
    """The update of a reduction nest's body that first initialises its element: a
    block of the statement's initialisation, guarded by the first iteration of every
    loop of `reductions` (`c9 == 0 && c10 == 0`, each loop's start), then its update of
    the same element (the initialisation fused into the reduction's band, as `Max`
    fusion schedules it: `tcpy.mapping.gpu.strategy.cuda_defaults`). None for any
    other body."""
    if node.get_type() != isl.ast_node_type.block or not reductions:
        return None
    children = list_items(node.block_get_children())
    if len(children) != 2 or children[0].get_type() != IF or children[0].if_has_else_node():
        return None
    guard, update = children
    init = guard.if_get_then_node()
    if init.get_type() != isl.ast_node_type.user or update.get_type() != isl.ast_node_type.user:
        return None
    first, then = printer.ast.user(init), printer.ast.user(update)
    init_stmt, update_stmt = (
        printer.scop.statement(first.statement),
        printer.scop.statement(then.statement),
    )
    if init_stmt.kind is not Kind.INIT or init_stmt.index != update_stmt.index:
        return None
    lhs = init_stmt.source(printer.scop.cdef).indices
    at, of = printer.instance(first), printer.instance(then)
    if any(at.values[v] != of.values[v] for v in lhs):
        return None
    starts = {r.id: r.node.for_get_init().to_C_str() for r in reductions}
    tests = _conjuncts(guard.if_get_cond())
    found = {}
    for test in tests:
        args = expr_args(test, isl.ast_expr_op_type.eq)
        if args is None or len(args) != 2 or expr_id(args[0]) not in starts:
            return None
        found[expr_id(args[0])] = args[1].to_C_str()
    return update if len(tests) == len(starts) and found == starts else None


def _conjuncts(e: isl.AstExpr) -> list[isl.AstExpr]:
    """The terms of a conjunction (`&&`, isl's `and`), or `e` alone."""
    for op in (isl.ast_expr_op_type.and_, isl.ast_expr_op_type.and_then):  # type: ignore[attr-defined]
        args = expr_args(e, op)
        if args is not None:
            return [t for a in args for t in _conjuncts(a)]
    return [e]


def print_thread_tile(
    printer: ThreadPrinter, tile: ThreadTile, depth: int, held: bool = False
) -> None:
    """`tile`'s outputs in a register array across the reduction loops: loaded
    before them, each step combining every one of them (unrolled: the
    operand values they share are loaded once), stored after it; a tile its nest
    initialises starts at the identity instead of being loaded. An output some
    threads do not have (the block does not divide the tile) is guarded. `held`:
    the array and its flag `tc_held` are declared above loops enclosing this nest
    (`print_held_tile`), which load it the first time the nest runs and store it
    after those loops."""
    parts, n = tile.parts, tile_size(tile)
    firsts = [f for f in (r.first() for r in tile.reductions) if f is not None]
    printer.emit(depth, f"if ({' && '.join(f'({f})' for f in firsts)}) {{" if firsts else "{")
    if tile.initialised:
        printer.emit(depth + 1, f"{parts.compute} tc_acc[{n}];")
        each_output(printer, tile, f"tc_acc[tc_j] = {parts.identity};", depth + 1)
    elif held:
        printer.emit(depth + 1, "if (!tc_held) {")
        move_outputs(printer, tile, depth + 2, store=False)
        printer.emit(depth + 2, "tc_held = true;")
        printer.emit(depth + 1, "}")
    else:
        printer.emit(depth + 1, f"{parts.compute} tc_acc[{n}];")
        move_outputs(printer, tile, depth + 1, store=False)
    loads = _step_loads(printer, tile)
    steps, innermost = (tile.steps if loads.stepped else 1), tile.reductions[-1]
    for k, loop in enumerate(tile.reductions[:-1]):
        printer.open_loop(depth + 1 + k, loop.text)
    at = depth + len(tile.reductions)
    if steps > 1:
        open_steps(printer, innermost, steps, at)
        read_steps(printer, steps_run(innermost, steps), loads.stepped, at + 1)
        step_value(printer, innermost, steps, at + 1)
        at += 1
    else:
        printer.open_loop(at, innermost.text)
    for k, read in enumerate(loads.shared):
        printer.emit(at + 1, f"const auto tc_o{k} = {read.text};")
    run = run_of(tile)
    if loads.along and run is not None:
        read_runs(printer, run, loads.along, at + 1)
    each_output(printer, tile, loads.step, at + 1)
    for k in reversed(range(depth + 1, at + 1)):
        printer.emit(k, "}")
    if not held:
        move_outputs(printer, tile, depth + 1, store=True)
    printer.emit(depth, "}")


def tile_size(tile: ThreadTile) -> int:
    return math.prod(s.trips for s in tile.strided)


def _store(tile: ThreadTile) -> str:
    return f"{tile.parts.target} = {tile.parts.store('tc_acc[tc_j]')};"


def each_output(printer: ThreadPrinter, tile: ThreadTile, line: str, at: int) -> None:
    """`line` for each output `tc_j` of the thread's tile, its strided loops' indices
    declared (an unrolled loop)."""
    printer.emit(at, "#pragma unroll")
    printer.emit(at, f"for (int tc_j = 0; tc_j < {tile_size(tile)}; tc_j++) {{")
    declare_indices(printer, tile.strided, "tc_j", 1, at + 1)
    guards = [s.loop.cond for s in tile.strided if not s.whole]
    if guards:
        line = f"if ({' && '.join(guards)}) {line}"
    printer.emit(at + 1, line)
    printer.emit(at, "}")


def move_outputs(printer: ThreadPrinter, tile: ThreadTile, at: int, store: bool) -> None:
    """Loads every output of `tile` into `tc_acc` (or, with `store`, stores them): a
    run of the thread's (`run_of`) at a time as one vector where its elements are
    adjacent and aligned, else one at a time."""
    parts, run = tile.parts, run_of(tile)
    line = _store(tile) if store else f"tc_acc[tc_j] = {parts.current};"
    macro = _output_macro(parts, store)
    if run is None or not all(s.whole for s in tile.strided) or macro is None:
        each_output(printer, tile, line, at)
        return
    printer.emit(at, "#pragma unroll")
    printer.emit(at, f"for (int tc_q = 0; tc_q < {tile_size(tile)}; tc_q += {run.trips}) {{")
    declare_indices(printer, tile.strided[:-1], "tc_q", run.trips, at + 1)
    found = run_access(printer, run, macro, parts.array, parts.element, at + 1)
    lanes = "xyzw"[: run.trips]
    if found is not None:
        vector, condition, moved = found
        printer.emit(at + 1, f"if ({condition}) {{")
        if store:
            values = ", ".join(parts.store(f"tc_acc[tc_q + {n}]") for n in range(run.trips))
            printer.emit(at + 2, f"{moved} = make_{vector}({values});")
        else:
            printer.emit(at + 2, f"const {vector} tc_v = {moved};")
            printer.emit(
                at + 2, " ".join(f"tc_acc[tc_q + {n}] = tc_v.{c};" for n, c in enumerate(lanes))
            )
        printer.emit(at + 1, "} else {")
    for n in range(run.trips):
        value = f"const int {run.loop.iterator} = {run.first} + {n};"
        printer.emit(
            at + 1 + (found is not None), f"{{ {value} const int tc_j = tc_q + {n}; {line} }}"
        )
    if found is not None:
        printer.emit(at + 1, "}")
    printer.emit(at, "}")


def _output_macro(parts: StatementParts, store: bool) -> str | None:
    """The access macro that moves the tile's output element, where one macro call
    does: its store (`TC_ST`) into a tensor, or its load, unconverted (a float16
    element is converted to float32 as it is loaded); None elsewhere."""
    if store:
        return None if parts.in_copy else "TC_ST"
    if parts.compute != parts.storage:
        return None
    return "TC_SLD" if parts.in_copy else "TC_LD"


def holds(printer: ThreadPrinter, node: isl.AstNode) -> bool:
    """Whether the code under a `private` mark is one chain, each node with one
    child, of loops, shared-memory copies, guards without an else and the mark of the
    thread's register tile, down to a
    loop strided by the block: a thread tile found there then is the only code
    below the mark."""
    while True:
        kind = node.get_type()
        if kind == FOR:
            if strided_loop(printer.loop_header(node), printer.kernel) is not None:
                return True
            node = node.for_get_body()
        elif kind == isl.ast_node_type.mark:
            if not isinstance(of_ast(node), Shared | ThreadRegisters):
                return False
            node = node.mark_get_node()
        elif kind == IF and not node.if_has_else_node():
            node = node.if_get_then_node()
        else:
            return False


def may_hold(held: Held, tile: ThreadTile) -> bool:
    """Whether `tile` may be held across the loops of `held`: there are some, the
    elements it computes are the same at every iteration of them (no loop's index in
    their addresses or in the strided loops), and they are in global memory (a copy
    in shared memory would be read again, stale, at each tile); not a tile its nest
    initialises, which starts again at each of their iterations."""
    if tile.initialised or not held.iterators or tile.instance.element_uses(*held.iterators):
        return False
    if any(s.loop.uses(*held.iterators) for s in tile.strided):
        return False
    return not tile.parts.in_copy


def print_held_tile(
    printer: ThreadPrinter, inner: isl.AstNode, depth: int, marks: tuple[Mark, ...]
) -> None:
    """The code under a `private` mark (`tcpy.mapping.gpu.placement`): when it is one chain of
    loops (a reduction's tile loops, around its copies into shared memory) down to a
    thread tile (`holds`), the tile's register array is declared here, loaded where
    the tile's nest first runs, kept across the chain's loops and stored after them,
    once: each output is loaded and stored once, not once per tile of the
    reduction. Printed as usual otherwise."""
    if printer.held is not None or not holds(printer, inner):
        printer.node(inner, depth, marks)
        return
    start = len(printer.lines)
    printer.held = Held([])
    printer.node(inner, depth + 1, marks)
    held, printer.held = printer.held, None
    tile = held.tile
    if tile is None:
        printer.lines[start:] = [line[2:] for line in printer.lines[start:]]  # as usual
        return
    declare = [f"{tile.parts.compute} tc_acc[{tile_size(tile)}];", "bool tc_held = false;"]
    printer.lines[start:start] = ["  " * depth + "{"] + ["  " * (depth + 1) + d for d in declare]
    printer.emit(depth + 1, "if (tc_held) {")
    move_outputs(printer, tile, depth + 2, store=True)
    printer.emit(depth + 1, "}")
    printer.emit(depth, "}")
