"""The GPU mapping as a strategy: loop nests become CUDA kernels, tile loops run on
blocks, point loops on threads.

`map_to_gpu` maps each top-level nest of a valid schedule (a statement sequence at the
top of the tree becomes a sequence of kernel launches, whose boundaries order every
dependence between nests) and returns a `GpuMapping`: the schedule with its mapping
filters and marks, the same schedule tiled but not bound (what `verify` checks), and a
`MappedKernel` per nest. `map_band` maps the outermost band of a nest in these steps:

1. rows: a nest fused over rows (a softmax under `Max` fusion) runs as a row kernel,
   one warp per row (`rows.map_rows`); a group run together over tiles of its rows
   (the online rewrite's, its rows first: `original_order(rows_first=True)`) as a
   row kernel over tiles (`online.map_online_rows`);
2. parallelism: the band's coincident members all go on the grid, the one that walks
   memory with unit stride on x, the next on y, the others folded into z; a reduction
   member that reads with unit stride where no parallel member does is spread over
   a warp's lanes (`band`); a band with neither runs in one thread;
   then a band of one contraction the tensor cores take is mapped for them
   instead of the steps below (`matrix`: warp tiles, its point loops under a
   `MatrixTile` mark, its copies and held accumulators), and the pointwise nests
   after it join it as its epilogue (`matrix.absorb_epilogues`, once every nest is
   mapped);
3. shared memory, decided in this step alone, with one budget (`device.shared_budget`):
   whether the block copies operand tiles into shared memory, the reduction tile at
   which those copies fit the budget, the runs of outputs a thread reads from them and
   the tensors copied and where (`fit_shared`, on trial bindings: `Copies`);
4. split reduction: a reduction whose parallel loops alone would not fill the device
   is split across blocks in chunks, combined with atomics (`sizes.split_chunk`);
5. sizes: the tiles and the block (`sizes.choose_sizes`);
6. tiles: the band's leading members tiled, the rest whole in the point band
   (`tile_leading_members`);
7. binding: the tile loops' members on blocks, the point loops' on threads, by
   filters `member mod size = parameter` (`bind.bind_members`: a grid or block smaller
   than the loop gives a strided loop, never a wrong result), with the mark of a lane
   or split reduction;
8. copies: the copies step 3 chose, marked where it chose (`placement.copy_into_shared`);
9. register tiles: the outputs a thread keeps in registers across their reduction
   (`placement.thread_tile`, marked on its point loops) and where that tile is loaded
   and stored (`placement.hold_registers`).

Only coincident members are bound, so no dependence crosses threads or blocks, but
for the lane and split reductions, which combine their partial results with shuffles
and atomics. The parameters are bounded in each kernel's AST build context, and each
kernel's AST is built from the schedule restricted to the kernel's statements.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import islpy as isl

from tcpy.mapping import marks
from tcpy.mapping.gpu.band import (
    atomic_reduction,
    grid_order,
    lane_member,
    parallel_prefix,
)
from tcpy.mapping.gpu.bind import bind_members, grid_sizes
from tcpy.mapping.gpu.device import DeviceProfile, default_profile, shared_budget
from tcpy.mapping.gpu.kernel import GpuMapping, MappedKernel
from tcpy.mapping.gpu.matrix import absorb_epilogues, map_matrix_band, matrix_plan
from tcpy.mapping.gpu.online import map_online_rows
from tcpy.mapping.gpu.placement import (
    copy_into_shared,
    copy_stages,
    hold_registers,
    plan_copies,
    reduction_steps,
    thread_runs,
    thread_tile,
    wanted_stages,
)
from tcpy.mapping.gpu.plan import Plan
from tcpy.mapping.gpu.rows import Rows, map_rows, row_fusable
from tcpy.mapping.gpu.shared import gathers
from tcpy.mapping.gpu.sizes import (
    FILL_WAVES,
    SHARED_REDUCTION_TILE,
    Request,
    Sizes,
    choose_sizes,
    split_chunk,
)
from tcpy.mapping.locality import runs_along
from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.mapping.rows import fuse_rows
from tcpy.naming import BLOCK_PARAMS, THREAD_PARAMS, size_name
from tcpy.parser.checked import CheckedDef, contraction
from tcpy.poly.dependences import Dependences
from tcpy.poly.isl_helpers import read_set, schedule_children, statement_names
from tcpy.poly.schedule import member_extent, original_order
from tcpy.poly.scop import Scop
from tcpy.poly.transforms import is_band, permute_band, tile_leading_members

SMALLEST_REDUCTION_TILE = 4
"""The smallest tile of the first reduction member `fit_shared` tries."""
SMALLEST_STAGED_TILE = 16
"""The smallest tile of the first reduction member `fit_shared` takes so that its
copies' ring holds `copy_stages` buffers (below it, fewer stages of a larger tile)."""


SMALL_WINDOW = 64
"""The most values a reduction's window (`window_reductions`) may have."""


def cuda_defaults(cdef: CheckedDef) -> MappingOptions:
    """The CUDA preset, with `Max` outer fusion for a pipeline of several statements
    that has no contraction (softmax, layernorm): each row is then one nest, mapped as
    a row kernel (`tcpy.mapping.gpu.rows`) whose intermediate values stay on the chip;
    and for reductions over small windows alone (`window_reductions`: a max-pool),
    whose initialisation then shares the reduction's band, so that a thread starts
    its outputs at the identity in registers and stores them once, in one launch
    (`tcpy.codegen.thread_tile`). A contraction keeps `Min`, which leaves its
    reduction loops one band to tile."""
    options = MappingOptions.cuda()
    if any(contraction(st) for st in cdef.statements):
        return options
    if len(cdef.statements) > 1 or window_reductions(cdef):
        return options.replace(outer_schedule_fusion=Fusion.MAX)
    return options


def window_reductions(cdef: CheckedDef) -> bool:
    """Whether `cdef` has reductions and each runs over a window of constant extent,
    `SMALL_WINDOW` values at most (`where kh in 0:2, kw in 0:2`): a thread then
    reduces its output's whole window itself; a reduction over a size (a row, a
    column sum) may be spread over lanes or split across blocks, whose combination
    needs the output initialised apart."""
    reductions = [st for st in cdef.statements if st.reduction_indices]
    if not reductions:
        return False
    for st in reductions:
        values = 1
        for var in st.reduction_indices:
            extent = st.range_of(var).hi - st.range_of(var).lo
            if not extent.is_const:
                return False
            values *= max(extent.const, 0)
        if values > SMALL_WINDOW:
            return False
    return True


def map_to_gpu(
    schedule: isl.Schedule,
    scop: Scop,
    options: MappingOptions,
    device: DeviceProfile | None = None,
    launched: Mapping[str, int] | None = None,
    deps: Dependences | None = None,
) -> GpuMapping:
    """`schedule` (valid for `scop`) mapped for `device` (default: `default_profile()`):
    every nest's band tiled, then bound to blocks and threads (see the module).
    `launched`: the sizes the kernels are launched at, when the schedule is for any
    size but the launch is for these (a CUDA kernel is built per shape): the grid
    then has no more blocks than its loops have tiles at them. With `deps` (and
    `fuse_rows`), runs of nests a row reduction needs whole are first fused over
    their rows (step 0), kept where each becomes a row kernel."""
    device = device or default_profile()
    scop.ctx.set_tile_scale_tile_loops(0)
    at = None
    if launched is not None and scop.sizes is None and scop.params:
        values = " and ".join(f"{size_name(p)} = {launched[p]}" for p in scop.params)
        at = read_set(scop.ctx, scop.isl_params, f": {values}")
    # the bands tiled, as `verify` checks them, each band's choices kept; then the same
    # tiles bound to blocks and threads, from the choices made once
    choices: list[Choice] = []
    if scop.cdef.together and deps is not None:  # a group's rows outermost (`online`)
        schedule = original_order(scop, deps, rows_first=True)
    if options.fuse_rows and deps is not None:
        fused = fuse_rows(schedule, scop, deps, tiled=False, accept=row_fusable(scop, options))
        root = fused.get_root().child(0)
        unbound = _map_nests(root, scop, options, device, [], choices, bind=False, at=at)
        if fused is schedule or _rows_kept(fused, schedule, choices):
            schedule = fused
        else:
            choices = []
    if not choices:
        root = schedule.get_root().child(0)
        unbound = _map_nests(root, scop, options, device, [], choices, bind=False, at=at)
    kernels: list[MappedKernel] = []
    bound = _map_nests(root, scop, options, device, kernels, choices, bind=True, at=at)
    kernels = absorb_epilogues(kernels, scop, scop.sizes or launched)
    return GpuMapping(bound.get_schedule(), unbound.get_schedule(), tuple(kernels))


def _rows_kept(fused: isl.Schedule, schedule: isl.Schedule, choices: list[Choice]) -> bool:
    """Whether every nest of `fused` that row fusion made (one that is no nest of
    `schedule`) was mapped as a row kernel (`choices`, a nest's each, in order)."""
    before = set(_nest_statements(schedule))
    return all(
        names in before or choice.rows is not None
        for names, choice in zip(_nest_statements(fused), choices, strict=True)
    )


def _nest_statements(schedule: isl.Schedule) -> list[frozenset[str]]:
    """The statements of each top-level nest of `schedule`, in order."""
    node = schedule.get_root().child(0)
    if node.get_type() not in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
        return [frozenset(statement_names(node.get_domain()))]
    return [frozenset(statement_names(c.filter_get_filter())) for c in schedule_children(node)]


def _map_nests(
    node: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    device: DeviceProfile,
    kernels: list[MappedKernel],
    choices: list[Choice],
    bind: bool,
    at: isl.Set | None = None,
) -> isl.ScheduleNode:
    """Map every top-level nest under `node`, appending its kernel to `kernels`;
    returns the node at the same position. Unbound, each nest's band's choices are
    appended to `choices`; bound, they are read from there (a nest per kernel, in
    order). `at`: the sizes of the launch (a set of the parameters), for the grid of
    a schedule for any size."""
    if node.get_type() in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
        for i in range(node.n_children()):
            child = _map_nests(
                node.child(i).child(0), scop, options, device, kernels, choices, bind, at
            )
            node = child.parent().parent()
        return node
    domain = node.get_domain()
    mapped, choice = Mapped(node, (), (), 1), Choice()
    if is_band(node):
        given = choices[len(kernels)] if bind else None
        mapped, choice = map_band(node, scop, options, device, bind, at, given)
    if not bind:
        choices.append(choice)
    kernels.append(
        MappedKernel(
            len(kernels),
            domain,
            mapped.grid,
            mapped.block,
            mapped.runs,
            mapped.matrix,
            stepped=mapped.stepped,
            turned=mapped.turned,
        )
    )
    return mapped.node


class Copies(NamedTuple):
    """Step 3's decision for a band whose block copies operand tiles into shared
    memory: the first reduction member's tile, the adjacent outputs a thread computes
    along x (`MappedKernel.runs`), the depth in the tile band the copies are made at
    (`placement.plan_copies`) and the tensors copied."""

    reduction_tile: int
    runs: int
    depth: int
    tensors: tuple[str, ...]
    stages: int = 1  # the buffers of their ring (`placement.copy_stages`)


class Choice(NamedTuple):
    """What a band's mapping chose by trying (a row kernel's rows and their copies;
    else steps 3 and 4): made once, on the unbound pass, and bound as chosen."""

    rows: Rows | None = None
    copies: Copies | None = None  # none: no shared memory
    split: int | None = None


class Mapped(NamedTuple):
    """A mapped band: the node at its position, the grid, the block, and the adjacent
    outputs a thread computes along x (`MappedKernel.runs`)."""

    node: isl.ScheduleNode
    grid: tuple[int, ...]
    block: tuple[int, ...]
    runs: int
    matrix: bool = False  # its contraction runs on the tensor cores (`matrix`)
    stepped: tuple[str, ...] = ()  # `MappedKernel.stepped`
    turned: tuple[str, ...] = ()  # `MappedKernel.turned`


def map_band(
    node: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    device: DeviceProfile,
    bind: bool,
    at: isl.Set | None = None,
    given: Choice | None = None,
) -> tuple[Mapped, Choice]:
    """The outermost band of a nest, mapped in the steps of the module (`bind` False:
    tiled only, as `verify` checks it; `at`: the launch's sizes, `map_to_gpu`), and
    what it chose; with `given`, the choices made before, not tried again."""
    # 1. rows
    fill = FILL_WAVES * device.sms
    rows = map_online_rows(node, scop, options, device, bind, at, given and given.rows)
    if rows is None:
        rows = map_rows(node, scop, options, device, fill, bind, at, given and given.rows)
    if rows is not None:
        mapped_rows, chosen = rows
        return Mapped(*mapped_rows, 1), Choice(rows=chosen)
    # 2. parallelism
    found = _parallelism(node, scop, options, device, at)
    if found is None:  # no parallel loop: the nest runs in one thread
        return Mapped(node, (), (), 1), Choice()
    node, plan = found
    # tensor cores, for a contraction of half-precision operands
    matrix = matrix_plan(node, scop, plan)
    on_matrix = map_matrix_band(node, scop, plan, matrix, bind) if matrix else None
    if on_matrix is not None:
        return Mapped(*on_matrix, 1, True), Choice()
    # 3. shared memory, and 4. a split reduction
    choice = given if given is not None else _choose(node, scop, plan)
    # 5. to 9.: sizes, tiles, binding, copies, register tiles
    bound = tile_and_bind(node, scop, plan, bind, choice.split, copies=choice.copies)
    return bound.mapped, choice


def _choose(node: isl.ScheduleNode, scop: Scop, plan: Plan) -> Choice:
    """Steps 3 and 4 for a band reordered by step 2: whether its block copies operand
    tiles into shared memory, at which reduction tile they fit (`fit_shared`), and the
    chunk of a reduction split across blocks where the grid would not fill the device
    (`sizes.split_chunk`)."""
    options, n, prefix = plan.options, node.band_n_member(), plan.prefix
    shared = options.use_shared_memory and plan.lanes is None and plan.permutable and prefix < n
    if shared and gathers(node, scop):
        shared = False  # the gathered reads dominate; the grid's parallelism counts more
    # tiles for shared memory only where some operand's tile is copied
    copies = fit_shared(node, scop, plan, member_extent(node, prefix)) if shared else None
    split = None
    splittable = prefix < n and copies is None and plan.lanes is None and plan.permutable
    if splittable and atomic_reduction(node, scop, options):
        trial = tile_and_bind(node, scop, plan, bind=False)
        blocks, threads = math.prod(trial.mapped.grid), math.prod(trial.mapped.block)
        split = split_chunk(blocks, threads, member_extent(node, prefix), plan.device)
    return Choice(None, copies, split)


def _parallelism(
    node: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    device: DeviceProfile,
    at: isl.Set | None = None,
) -> tuple[isl.ScheduleNode, Plan] | None:
    """Step 2: the band with its members reordered (the grid's order, then the other
    members, then the lane member last) and the plan; None when it has neither a
    parallel member nor a lane member."""
    n, prefix = node.band_n_member(), parallel_prefix(node)
    permutable = bool(node.band_get_permutable())
    lanes = lane_member(node, scop, options, prefix, device) if permutable else None
    if prefix == 0 and lanes is None:
        return None
    mapped = min(prefix, len(options.map_to_blocks) or len(BLOCK_PARAMS))
    if permutable and (prefix > 1 or lanes is not None):
        order = grid_order(node, scop, prefix, mapped) if prefix > 1 else list(range(prefix))
        rest = [k for k in range(prefix, n) if k != lanes]
        node = permute_band(node, order + rest + ([lanes] if lanes is not None else []))
        lanes = None if lanes is None else n - 1
    members = [prefix - 1 - j for j in range(mapped)]  # by grid dimension: x innermost
    budget = shared_budget(options, device)
    return node, Plan(options, device, permutable, prefix, members, lanes, budget, at)


class Bound(NamedTuple):
    """A band tiled and (maybe) bound: the mapping, its copies into shared memory
    (decided on a trial, `fit_shared`, or given), and whether every tensor worth
    copying is copied (`placement.plan_copies`)."""

    mapped: Mapped
    copies: Copies | None
    complete: bool


def fit_shared(node: isl.ScheduleNode, scop: Scop, plan: Plan, extent: int | None) -> Copies | None:
    """Step 3: shared-memory tiles, the first reduction member's tile (of `extent`
    values) `SHARED_REDUCTION_TILE` and halved, while that shortens it, down to
    `SMALLEST_REDUCTION_TILE`, as long as some operand worth copying does not fit the
    budget with the others (a convolution's input at 32 channels: its box spans the
    tile's channels and the windows of the block's outputs), each tile tried on a
    binding of the band. Returns the copies of the trial that copies the most
    operands (the larger tile among equals); None where no trial copies any. Where
    every operand fits but not their ring of `copy_stages` buffers (pipelined copies),
    the tile halves on, down to `SMALLEST_STAGED_TILE`, for the largest tile whose ring
    of that many fits with the same operands; failing that, the largest whose ring has
    two or more; failing that, the tile with one buffer (`_reduction_tiles`: the
    tiles, fewer values of the first member where the members after it are long)."""
    tiles, staged_floor = _reduction_tiles(node, plan)
    wanted = wanted_stages(plan.options, plan.device)
    best: Copies | None = None
    complete: Copies | None = None  # the largest tile copying every operand
    staged: Copies | None = None  # the largest after it with a ring of 2 or more
    for tile in [tiles[0], *(t for t in tiles[1:] if extent is None or t < extent)]:
        trial = tile_and_bind(node, scop, plan, bind=True, trial_tile=tile)
        copies = trial.copies
        if complete is not None:  # looking for a tile whose ring fits
            if copies is not None and copies.tensors == complete.tensors:
                if copies.stages == wanted:
                    return copies
                if staged is None and copies.stages > 1:
                    staged = copies
            if tile <= staged_floor:
                break
            continue
        if copies is not None and (best is None or len(copies.tensors) > len(best.tensors)):
            best = copies
        if trial.complete:
            if copies is None or copies.stages >= wanted:
                break
            complete = copies
            if tile <= staged_floor:
                break
    return staged or best


def _reduction_tiles(node: isl.ScheduleNode, plan: Plan) -> tuple[list[int], int]:
    """The tiles of the first reduction member `fit_shared` tries, and the smallest it
    takes for a ring. Counted in values of the whole reduction a tile spans: where
    the members after the first span `depth` values together (an output projection's
    64 values of `e` below its heads `h`), the tiles halve down to 1 (down to
    `SMALLEST_REDUCTION_TILE` where `depth` is under `SMALLEST_STAGED_TILE`), the ring's
    smallest is `SMALLEST_STAGED_TILE / depth` (a tile of one head there: a ring of
    64 values, with the operand whose lanes walk `n` copied too, not read across
    memory)."""
    below = [member_extent(node, m) for m in range(plan.prefix + 1, node.band_n_member())]
    depth = 1 if None in below else math.prod(e for e in below if e is not None)
    smallest = 1 if depth >= SMALLEST_STAGED_TILE else SMALLEST_REDUCTION_TILE
    tiles = [SHARED_REDUCTION_TILE]
    while tiles[-1] > smallest:
        tiles.append(tiles[-1] // 2)
    return tiles, max(1, SMALLEST_STAGED_TILE // depth)


def tile_and_bind(
    node: isl.ScheduleNode,
    scop: Scop,
    plan: Plan,
    bind: bool,
    split: int | None = None,
    copies: Copies | None = None,
    trial_tile: int | None = None,
) -> Bound:
    """Steps 5 to 9 on a band reordered by step 2: its sizes, its tiling and, with
    `bind`, its binding, copies and register tile. With `split` (a chunk size), the
    first reduction member is tiled by it and its tiles go on the grid too, after the
    plan's members: blocks combine their partial results with atomics. With `copies`
    (step 3's), the block copies into shared memory as they say; with `trial_tile`
    instead (step 3 trying it), the first reduction member's tile is that, and the
    copies are decided here and returned."""
    extents = [member_extent(node, m) for m in plan.members]
    reduction_tile = copies.reduction_tile if copies is not None else trial_tile
    sizes = _sizes(node, plan, extents, reduction_tile, split)
    on_grid = plan.members if split is None else [*plan.members, plan.prefix]
    # the tensors read along x, for a thread's run of outputs: of the band untiled
    read_along_x = (
        runs_along(node, plan.members[0], scop)
        if trial_tile is not None and plan.lanes is None
        else None
    )
    steps, walked, turned = _steps(node, scop, plan, sizes)
    # 6. tiles
    leading: list[int] = []  # the sizes of the members tiled (none: no tile band)
    if sizes is not None and (any(sizes.tile) or plan.lanes is not None):
        leading = sizes.leading()
        if leading:
            node = tile_leading_members(node, leading)
        grid = grid_sizes(plan.options, [member_extent(node, m, plan.at) for m in on_grid])
        block = sizes.block
    else:  # untiled: the loops themselves on blocks, one thread each
        launched = [member_extent(node, m, plan.at) for m in plan.members]
        grid, block = grid_sizes(plan.options, launched), []
    # 7. binding: the grid
    if bind:
        node = bind_members(node, on_grid, grid, BLOCK_PARAMS)
    runs, complete = (copies.runs if copies is not None else 1), True
    registers = None
    if block:
        assert sizes is not None
        if copies is None and trial_tile is not None:
            point = node.child(0) if leading else node
            runs = _runs(point, scop, plan, sizes, extents, read_along_x)
        registers = _registers(plan, sizes, extents, split, node.band_n_member(), steps)
        node, copies, complete = _threads(
            node, scop, plan, sizes, leading, runs, split, bind, copies, trial_tile, registers
        )
    if bind and on_grid:
        node = node.parent()  # the block filter, now at the band's old position
    stepping = registers is not None and registers.steps > 1
    stepped, turned = (walked, turned) if stepping else ((), ())  # their copies' rows
    mapped = Mapped(node, tuple(grid), tuple(block), runs, stepped=stepped, turned=turned)
    return Bound(mapped, copies, complete)


def _sizes(
    node: isl.ScheduleNode,
    plan: Plan,
    extents: list[int | None],
    reduction_tile: int | None,
    split: int | None,
) -> Sizes | None:
    """Step 5: the band's sizes (`sizes.choose_sizes`), `extents` those of the plan's
    members, for shared memory where the first reduction member's tile is
    `reduction_tile`; None for a band that is not permutable, which is not tiled."""
    if not plan.permutable:
        return None
    shared = reduction_tile is not None
    request = Request(
        plan.options, node.band_n_member(), plan.prefix, plan.members, extents, plan.device,
        plan.lanes, shared, split, reduction_tile or SHARED_REDUCTION_TILE,
    )  # fmt: skip
    return choose_sizes(request)


def _runs(
    point: isl.ScheduleNode,
    scop: Scop,
    plan: Plan,
    sizes: Sizes,
    extents: list[int | None],
    read_along_x: set[str] | None,
) -> int:
    """The adjacent outputs a thread of the tile's `point` band computes along x
    (`placement.thread_runs`), with shared memory; 1 without (strided by the block)."""
    if read_along_x is None:
        return 1
    x = plan.members[0]
    tile_x = sizes.tile[x] or 1
    block = sizes.block
    return thread_runs(
        point, scop, plan.options, plan.budget, read_along_x, block[0], tile_x, extents[0]
    )


def _registers(
    plan: Plan, sizes: Sizes, extents: list[int | None], split: int | None, n: int, steps: int
) -> marks.ThreadRegisters | None:
    """Step 9's register tile of a thread (`placement.thread_tile`), for a band of `n`
    members with a reduction (members past the parallel ones) with `use_private_memory`,
    neither spread over lanes nor `split`; `extents`: those of the plan's members;
    `steps` of the innermost reduction loop at a time (`placement.reduction_steps`)."""
    if not plan.options.use_private_memory or plan.lanes is not None or split is not None:
        return None
    if plan.prefix == n:
        return None
    tiles = [sizes.tile[m] or e for m, e in zip(plan.members, extents, strict=True)]
    return thread_tile(tiles, sizes.block, steps)


def _steps(
    node: isl.ScheduleNode, scop: Scop, plan: Plan, sizes: Sizes | None
) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
    """The steps of a thread's innermost reduction loop (the last member of the untiled
    band `node`) taken at a time, the operands read along them as vectors and those
    whose copies are turned for it (`placement.reduction_steps`); 1 and none for a
    band without a reduction."""
    last = node.band_n_member() - 1
    if sizes is None or last < plan.prefix:
        return 1, (), ()
    rows = plan.members[1] if len(plan.members) > 1 else None
    return reduction_steps(node, scop, plan.options, last, sizes.tile[last], rows)


def _threads(
    node: isl.ScheduleNode,
    scop: Scop,
    plan: Plan,
    sizes: Sizes,
    leading: list[int],
    runs: int,
    split: int | None,
    bind: bool,
    copies: Copies | None,
    trial_tile: int | None,
    registers: marks.ThreadRegisters | None,
) -> tuple[isl.ScheduleNode, Copies | None, bool]:
    """Steps 7 to 9 below the grid: the point loops on threads (`runs` adjacent
    outputs each along x), the reduction's mark, the copies into shared memory (as
    `copies` say; on step 3's trial of `trial_tile`, as decided here) and the
    register tile (`registers`, marked on the point loops). `node`: the tile band
    (the band itself where nothing is tiled).
    Returns the node at `node`'s position, the copies and whether every tensor worth
    copying is copied."""
    options, block, members = plan.options, sizes.block, plan.members
    point = node.child(0) if leading else node  # the band of the members on threads
    on_threads = ([plan.lanes] if plan.lanes is not None else []) + members
    if bind:
        point = bind_members(point, on_threads[: len(block)], block, THREAD_PARAMS, (runs,))
        if plan.lanes is not None or split is not None or registers is not None:
            mark = marks.Lanes() if plan.lanes is not None else registers or marks.Atomic()
            point = marks.insert(point, mark).parent()
        point = point.parent()  # the thread filter
    node = point.parent() if leading else point  # the tile band, if any
    first = plan.prefix + (split is not None)  # the members of the tile band on the grid
    complete = True
    if bind and copies is None and trial_tile is not None:  # step 3's trial
        depth, tensors, complete = plan_copies(
            node, scop, options, plan.budget, first, on_threads[0]
        )
        stages = copy_stages(node, depth, tuple(tensors), scop, options, plan.device, plan.budget)
        copies = Copies(trial_tile, runs, depth, tuple(tensors), stages) if tensors else None
    if bind and copies is not None:  # 8. copies
        node = copy_into_shared(node, copies.depth, copies.tensors, copies.stages)
    if bind and options.use_private_memory and plan.lanes is None:  # 9. register tiles
        node = hold_registers(node, options.private_depth, first)
    return node, copies, complete
