"""GPU mapping: loop nests become CUDA kernels, tile loops run on blocks, point loops
on threads.

`map_to_gpu(schedule, scop, options, device)` expects a valid schedule of `scop` and
returns a `GpuMapping`: the schedule with its mapping filters, and one `Kernel` per
top-level loop nest (a statement sequence at the top of the tree becomes a sequence of
kernel launches, whose boundaries order every dependence between nests).

In each nest (PPCG style) the outermost permutable band is tiled, and its coincident
members, all of them, go on the grid: the member that walks the innermost array
dimension with unit stride (chosen among all of them) on x, the next best on y, the
others folded into z (`Kernel.block_index` decodes them). The same members' point
loops go on threadIdx.x and .y. Binding is by filters `member mod size = parameter`,
so a grid or block smaller than the loop gives a strided loop, never a wrong result.
Only coincident members are bound, so no dependence crosses threads or blocks, with
one exception made safe by construction: a *lane reduction*, a reduction loop that
reads its operands with unit stride where no parallel loop does (a softmax's row
maximum), is spread over the 32 lanes of a warp, each lane reducing every 32nd value
into a register, the warp combining them with shuffles (`LANES_MARK`,
`tcpy.codegen.cuda`). Other reductions run whole in their thread, innermost. A nest
fused over rows (a softmax under `Max` fusion) runs as a row kernel, one warp per row
(`tcpy.mapping.rows`).

Sizes: the options' where given; else each thread computes one element, the block
is 32x8 threads tightened to the loops, and its y halves while the grid would not fill
the device (`FILL_WAVES` blocks per SM of the `DeviceProfile`). A nest with no
parallel loop runs in one thread (one warp for a lane reduction).

The parameters are bounded in each kernel's AST build context (isl's AST generator
here rejects schedule-tree context nodes), and each kernel's AST is built from the
schedule restricted to the kernel's statements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import islpy as isl

from tcpy.codegen.loops import ATOMIC_MARK, LANES_MARK
from tcpy.codegen.naming import BLOCK_PARAMS, THREAD_PARAMS
from tcpy.errors import InternalError
from tcpy.mapping.bind import bind_members, count_blocks, grid_sizes
from tcpy.mapping.cpu import contraction
from tcpy.mapping.device import SHUFFLED, WARP, DeviceProfile, default_profile, shared_budget
from tcpy.mapping.locality import runs_along, stride_score, worst_stride
from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.mapping.placement import copy_into_shared, hold_registers, thread_runs
from tcpy.mapping.promotion import candidates, stays_along
from tcpy.mapping.rows import map_rows
from tcpy.mapping.shared import gathers
from tcpy.parser import ast
from tcpy.parser.checked import CheckedDef
from tcpy.poly.isl_helpers import read_set, union_set_sets
from tcpy.poly.schedule import member_extent
from tcpy.poly.scop import Kind, Scop
from tcpy.poly.transforms import insert_mark, is_band, permute_band, tile_leading_members
from tcpy.types import ScalarType

DEFAULT_BLOCK = (32, 8, 1)
FILL_WAVES = 2
"""Blocks a grid should have per SM when the problem allows: with fewer, SMs idle."""
ELEMENTS_PER_THREAD = 4
"""In a nest of parallel loops alone (an elementwise kernel) whose grid would still
fill the device twice over with resident threads: the elements each thread computes
along x, a block's width apart (each access stays coalesced, and a thread has that
many loads in flight: measured on an H200, a 128 MB gelu went from 53% to 89% of the
copy bandwidth)."""
SHARED_TILE = 32
"""With shared memory: a block's tile along threadIdx.x's member."""
SHARED_ROWS = 4
"""With shared memory: the elements each thread computes along threadIdx.y's member
(32x8 threads compute 32x32 outputs; narrowed to fill the device, never below 32x4
threads computing 32x16)."""
NARROWEST_SHARED_TILE = SHARED_TILE * 4 * SHARED_ROWS
"""The fewest outputs a block computes with shared memory (32x4 threads, 32x16)."""
LARGE_THREAD_TILE = (8, 4)
"""With shared memory, where the grid still fills the device with it: the outputs
each thread computes along y and x (32x8 threads, 64x128 outputs; the tiles of A and B
take 48 KB at the reduction tile of 64; a thread's four outputs along x adjacent,
`Kernel.runs`). NVRTC's PTX then makes 9 shared loads per 32 FMAs (8 of A, one float4
of B), against 1.25 per FMA at 4x1. Measured on an H200 at 4096 cubed: 6.1 ms, against
7.5 at 8x2 and 8.2 at 8x8 (the tuner searches `register_tile`)."""
SHARED_REDUCTION_TILE = 64
"""With shared memory: the tile of the first reduction member, along which a block
copies its operands' tiles (a matmul's 32x64 and 64x32: 16 KB; each output is loaded
and stored once per tile)."""
ATOMICS = {
    (ast.Reduction(op), ScalarType(ty))
    for op, types in (
        ("+", ("float32", "float64", "int32", "uint32")),
        ("max", ("int32", "uint32")),
        ("min", ("int32", "uint32")),
    )
    for ty in types
}  # fmt: skip
"""The reductions and element types CUDA has a native atomic for (`atomicAdd`,
`atomicMax`, `atomicMin`): float max and min have none, and would lose NaN."""
SMALLEST_REDUCTION_TILE = 4
"""The smallest tile of the first reduction member `_fit_shared` tries."""
MIN_CHUNK = 64
"""The fewest values of a reduction a block runs when the reduction is split."""


@dataclass(frozen=True, eq=False, slots=True)
class Kernel:
    index: int
    domain: isl.UnionSet  # the statement instances this kernel runs
    grid: tuple[int, ...]  # blocks along x, y, then the dimensions folded into z
    block: tuple[int, ...]  # threads along x, y, z
    runs: int = 1  # adjacent outputs a thread computes along x (1: strided by the block)

    @property
    def threads(self) -> int:
        return math.prod(self.block)

    @property
    def blocks(self) -> int:
        return math.prod(self.grid)

    def launch_dims(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        grid = (*self.grid[:2], math.prod(self.grid[2:]), 1, 1)[:3]
        block = (*self.block, 1, 1, 1)[:3]
        return (grid[0], grid[1], grid[2]), (block[0], block[1], block[2])

    def block_index(self, j: int) -> str:
        """The CUDA expression of the block index along grid dimension `j`: x, y,
        and the folded dimensions decoded from z (the first varies fastest)."""
        if j < 2 or len(self.grid) == 3:
            return f"blockIdx.{'xyz'[j]}"
        index = "blockIdx.z"
        below = math.prod(self.grid[2:j])
        if below > 1:
            index = f"({index} / {below}u)"
        return index if j == len(self.grid) - 1 else f"({index} % {self.grid[j]}u)"


@dataclass(frozen=True, eq=False, slots=True)
class GpuMapping:
    schedule: isl.Schedule  # with the filters that bind loops to blocks and threads
    unbound: isl.Schedule  # the same schedule before binding (what `verify` can check)
    kernels: tuple[Kernel, ...]

    def context(self, scop: Scop, kernel: Kernel) -> isl.Set:
        """The AST build context of a kernel: the scop's, and the bounds of the block
        and thread parameters it uses."""
        names = [*BLOCK_PARAMS[: len(kernel.grid)], *THREAD_PARAMS[: len(kernel.block)]]
        sizes = [*kernel.grid, *kernel.block]
        params = (*scop.isl_params, *names)
        bounds = " and ".join(f"0 <= {n} < {s}" for n, s in zip(names, sizes, strict=True))
        extra = read_set(scop.ctx, params, ": " + (bounds or "true"))
        return extra.intersect(scop.context.align_params(extra.get_space()))


def cuda_defaults(cdef: CheckedDef) -> MappingOptions:
    """The CUDA preset, with `Max` outer fusion for a pipeline of several statements
    that has no contraction (softmax, layernorm): each row is then one nest, mapped as
    a row kernel (`tcpy.mapping.rows`) whose intermediate values stay on the chip. A
    contraction keeps `Min`, which leaves its reduction loops one band to tile."""
    options = MappingOptions.cuda()
    if len(cdef.statements) > 1 and not any(contraction(st) for st in cdef.statements):
        return options.replace(outer_schedule_fusion=Fusion.MAX)
    return options


def map_to_gpu(
    schedule: isl.Schedule,
    scop: Scop,
    options: MappingOptions,
    device: DeviceProfile | None = None,
) -> GpuMapping:
    """`device`: the profile mapped for (default: `default_profile()`)."""
    device = device or default_profile()
    scop.ctx.set_tile_scale_tile_loops(0)
    root = schedule.get_root().child(0)
    unbound = _map_nests(root, scop, options, device, [], bind=False)
    kernels: list[Kernel] = []
    bound = _map_nests(root, scop, options, device, kernels, bind=True)
    return GpuMapping(bound.get_schedule(), unbound.get_schedule(), tuple(kernels))


def _map_nests(
    node: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    device: DeviceProfile,
    kernels: list[Kernel],
    bind: bool,
) -> isl.ScheduleNode:
    """Map every top-level nest under `node`; returns the node at the same position."""
    if node.get_type() in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
        for i in range(node.n_children()):
            child = _map_nests(node.child(i).child(0), scop, options, device, kernels, bind)
            node = child.parent().parent()
        return node
    domain = node.get_domain()
    grid: tuple[int, ...] = ()
    block: tuple[int, ...] = ()
    runs = 1
    if is_band(node):
        node, grid, block, runs = _map_band(node, scop, options, device, bind)
    kernels.append(Kernel(len(kernels), domain, grid, block, runs))
    return node


def _map_band(
    node: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    device: DeviceProfile,
    bind: bool,
) -> tuple[isl.ScheduleNode, tuple[int, ...], tuple[int, ...], int]:
    """Map the outermost band of a nest: choose the lane reduction, the order of the
    grid's members, shared-memory tiles (only where an operand's tile is copied) or a
    split reduction, then tile and bind. Returns the node at the band's position, the
    grid, the block and the runs of `Kernel.runs`."""
    rows = map_rows(node, scop, options, device, FILL_WAVES * device.sms, bind)
    if rows is not None:
        return (*rows, 1)
    n = node.band_n_member()
    permutable = bool(node.band_get_permutable())
    coincident = [bool(node.band_member_get_coincident(k)) for k in range(n)]
    prefix = next((k for k in range(n) if not coincident[k]), n)
    if not permutable:
        prefix = min(prefix, 1)
    lanes = _lane_member(node, scop, options, prefix, device) if permutable else None
    if prefix == 0 and lanes is None:
        return node, (), (), 1  # no parallel loop: the nest runs in one thread
    mapped = min(prefix, len(options.map_to_blocks) or len(BLOCK_PARAMS))
    if permutable and (prefix > 1 or lanes is not None):
        order = _grid_order(node, scop, prefix, mapped) if prefix > 1 else list(range(prefix))
        rest = [k for k in range(prefix, n) if k != lanes]
        node = permute_band(node, order + rest + ([lanes] if lanes is not None else []))
        lanes = None if lanes is None else n - 1
    members = [prefix - 1 - j for j in range(mapped)]  # by grid dimension: x innermost
    chosen: _Chosen = (options, device, prefix, members, lanes)
    shared = options.use_shared_memory and lanes is None and permutable and prefix < n
    if shared and gathers(node, scop):
        shared = False  # the gathered reads dominate; the grid's parallelism counts more
    reduction_tile = SHARED_REDUCTION_TILE
    if shared:  # tiles for shared memory only where some operand's tile is copied
        trial, reduction_tile = _fit_shared(node, scop, chosen, member_extent(node, prefix))
        shared = bool(trial.copied)
        if shared and bind:  # the trial is the mapping
            return trial.node, trial.grid, trial.block, trial.runs
    split = None
    splittable = prefix < n and not shared and lanes is None and permutable
    if splittable and _atomic_reduction(node, scop, options):
        trial = _tile_and_bind(node, scop, *chosen, shared=False, bind=False)
        split = _split(
            math.prod(trial.grid), math.prod(trial.block), member_extent(node, prefix), device
        )
    bound = _tile_and_bind(
        node, scop, *chosen, shared=shared, bind=bind, split=split, reduction_tile=reduction_tile
    )
    return bound.node, bound.grid, bound.block, bound.runs


class _Bound(NamedTuple):
    node: isl.ScheduleNode  # at the band's position
    grid: tuple[int, ...]
    block: tuple[int, ...]
    copied: list[str]  # the tensors copied into shared memory
    runs: int  # `Kernel.runs`
    complete: bool  # every tensor worth copying is (`placement.copy_into_shared`)


_Chosen = tuple[MappingOptions, DeviceProfile, int, list[int], int | None]
"""What `_map_band` chose for `_tile_and_bind`: the options, the device, how many of
the band's members are parallel, those on the grid, the lane member."""


def _fit_shared(
    node: isl.ScheduleNode, scop: Scop, chosen: _Chosen, extent: int | None
) -> tuple[_Bound, int]:
    """Shared-memory tiles, the first reduction member's tile (of `extent` values)
    `SHARED_REDUCTION_TILE` and halved, while that shortens it, down to
    `SMALLEST_REDUCTION_TILE`, as long as some operand worth copying does not fit the
    budget with the others (a convolution's input at 32 channels: its box spans the
    tile's channels and the windows of the block's outputs). Returns the trial that
    copies the most operands, the larger tile among equals, and its reduction tile."""
    tiles = [SHARED_REDUCTION_TILE]
    while tiles[-1] > SMALLEST_REDUCTION_TILE:
        tiles.append(tiles[-1] // 2)
    best: tuple[_Bound, int] | None = None
    for tile in [tiles[0], *(t for t in tiles[1:] if extent is None or t < extent)]:
        trial = _tile_and_bind(node, scop, *chosen, shared=True, bind=True, reduction_tile=tile)
        if best is None or len(trial.copied) > len(best[0].copied):
            best = (trial, tile)
        if trial.complete:
            break
    assert best is not None
    return best


def _tile_and_bind(
    node: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    device: DeviceProfile,
    prefix: int,
    members: list[int],
    lanes: int | None,
    shared: bool,
    bind: bool,
    split: int | None = None,
    reduction_tile: int = SHARED_REDUCTION_TILE,
) -> _Bound:
    """Tile the band (the sizes of `_Sizes.choose`) and, with `bind`, bind `members`
    to the grid and the point loops to the threads, with the lane-reduction and
    shared-memory marks. With `split` (a chunk size), the first reduction member is
    tiled by it and its tiles go on the grid too, after `members`: blocks combine
    their partial results with atomics (`ATOMIC_MARK`). With `shared`, the first
    reduction member's tile is `reduction_tile`."""
    n = node.band_n_member()
    permutable = bool(node.band_get_permutable())
    extents = [member_extent(node, m) for m in members]
    sizes = (
        _Sizes.choose(
            options, n, prefix, members, extents, device, lanes, shared, split, reduction_tile
        )
        if permutable
        else None
    )
    on_grid = members if split is None else [*members, prefix]
    copied: list[str] = []
    runs, complete = 1, True
    read_along_x = runs_along(node, members[0], scop) if shared and lanes is None else None
    leading: list[int] = []  # the sizes of the members tiled (none: no tile band)
    if sizes is not None and (any(sizes.tile) or lanes is not None):
        leading = sizes.leading()
        if leading:
            node = tile_leading_members(node, leading)
        grid = grid_sizes(options, [member_extent(node, m) for m in on_grid])
        block = sizes.block
    else:  # untiled: the loops themselves on blocks, one thread each
        grid, block = grid_sizes(options, extents), []
    if bind:
        node = bind_members(node, on_grid, grid, BLOCK_PARAMS)
    if block:
        point = node.child(0) if leading else node  # the band of the members on threads
        budget = shared_budget(options, device)
        if read_along_x is not None and sizes is not None:
            tile_x = sizes.tile[members[0]] or 1
            runs = thread_runs(
                point, scop, options, budget, read_along_x, block[0], tile_x, extents[0]
            )
        if bind:
            on_threads = ([lanes] if lanes is not None else []) + members
            point = bind_members(point, on_threads[: len(block)], block, THREAD_PARAMS, (runs,))
            if lanes is not None or split is not None:
                mark = LANES_MARK if lanes is not None else ATOMIC_MARK
                point = insert_mark(point, mark).parent()
            point = point.parent()  # the thread filter
        node = point.parent() if leading else point  # the tile band, if any
        first = prefix + (split is not None)  # the members of the tile band on the grid
        if bind and shared:
            node, copied, complete = copy_into_shared(
                node, scop, options, budget, first, on_threads[0]
            )
        if bind and options.use_private_memory and lanes is None:
            node = hold_registers(node, options.private_depth, first)
    if bind and on_grid:
        node = node.parent()  # the block filter, now at the band's old position
    return _Bound(node, tuple(grid), tuple(block), copied, runs, complete)


@dataclass(frozen=True, slots=True)
class _Sizes:
    """The tile sizes of a band (member by member; 0: not tiled, the loop whole in the
    tile band; None: not tiled, the loop whole in the point band, and so are the
    members after it) and the block (threads along x, y, z) of the members mapped to
    threads."""

    tile: list[int | None]
    block: list[int]

    def leading(self) -> list[int]:
        """The sizes of the members tiled (`tile_leading_members`): those before the
        first None, a 0 as 1 (the tile loop is the whole loop)."""
        n = self.tile.index(None) if None in self.tile else len(self.tile)
        if any(t is not None for t in self.tile[n:]):
            raise InternalError(f"members left whole before tiled ones: {self.tile}")
        return [t or 1 for t in self.tile[:n] if t is not None]

    @staticmethod
    def choose(
        options: MappingOptions,
        n: int,
        prefix: int,
        members: list[int],
        extents: list[int | None],
        device: DeviceProfile,
        lanes: int | None = None,
        shared: bool = False,
        split: int | None = None,
        reduction_tile: int = SHARED_REDUCTION_TILE,
    ) -> _Sizes:
        """The options' sizes where they give them. Else each thread computes one
        element of its tile: the tile of a member on threads is the block's size
        along it, the tile of a member on blocks only is 1, and a reduction's loops
        stay whole in the thread (innermost, the accumulator in a register). With
        `lanes` (a reduction member spread over the lanes of a warp), x is a warp on
        it and y the innermost member of the grid. A block is tightened to the loops
        it runs; then, while the grid would not fill the device `FILL_WAVES` times
        over, its y size halves (never below a warp). With `shared` (operand tiles
        in shared memory), the tile is `SHARED_TILE` along x and `SHARED_ROWS` times
        the block along y (a thread computes several elements, strided by the block;
        the block's y halves down to `SHARED_ROWS`, and only when that fills the
        device: otherwise the larger tile's reuse is worth more) and the first
        reduction member is tiled by `reduction_tile` (`SHARED_REDUCTION_TILE`, or
        less where the copies would not fit, `_fit_shared`): the copy is made once
        per tile of it, for the whole block. With `split`, the first reduction
        member's tile is that chunk."""
        threads = min(len(members) + (lanes is not None), len(options.map_to_threads) or 2)
        wanted = list(options.map_to_threads or DEFAULT_BLOCK)[:threads]
        wanted += [1] * (threads - len(wanted))
        on_threads = members if lanes is None else [lanes, *members]
        shape = extents if lanes is None else [WARP, *extents]

        def tiles(
            block: list[int], per_thread: tuple[int, ...] = options.register_tile
        ) -> list[int | None]:
            if options.tile:
                return [options.tile[k] if k < len(options.tile) else 0 for k in range(n)]
            tile: list[int | None] = [1 if k < prefix else None for k in range(n)]
            for j, size in enumerate(block):
                if on_threads[j] != lanes:
                    tile[on_threads[j]] = _shared_tile(j, size, per_thread) if shared else size
            if shared:
                tile[prefix] = reduction_tile
            if split:
                tile[prefix] = split
            return tile

        def tightened(
            block: list[int], per_thread: tuple[int, ...] = options.register_tile
        ) -> list[int]:
            """Each size at most the extent of the point loop it runs (a tile of 0
            leaves one point per tile)."""
            tile = tiles(block, per_thread)
            out = []
            for j, size in enumerate(block):
                point, e = tile[on_threads[j]], shape[j]
                point = size if point is None else point or 1  # a whole loop: its extent
                out.append(max(1, min(size, point, e if e is not None else point)))
            return out

        block = tightened(wanted)
        fill = FILL_WAVES * device.sms
        chosen = not (options.register_tile or options.tile or options.map_to_threads)
        if shared and chosen and len(block) > 1:  # the larger tiles, where they still fill it
            large = tiles(wanted, LARGE_THREAD_TILE)
            if (
                tightened(wanted, LARGE_THREAD_TILE) == wanted
                and count_blocks(extents, large, members) >= fill
            ):
                return _Sizes(large, wanted)
        if shared and len(block) > 1:
            narrowest = tightened([block[0], min(block[1], SHARED_ROWS), *block[2:]])
            if count_blocks(extents, tiles(narrowest), members) < fill:
                return _Sizes(tiles(block), block)  # cannot fill it: keep the most reuse
        if chosen and not shared and lanes is None and prefix == n and block:
            coarse = tiles(block)
            x = on_threads[0]
            coarse[x] = along_x = (coarse[x] or 1) * ELEMENTS_PER_THREAD
            if (extents[members.index(x)] or 0) >= along_x and count_blocks(
                extents, coarse, members
            ) * math.prod(block) >= FILL_WAVES * device.resident_threads:
                return _Sizes(coarse, block)
        if not options.tile and not options.map_to_threads:
            while (
                len(block) > 1
                and block[1] > (SHARED_ROWS if shared else 1)
                and block[0] * block[1] // 2 >= WARP
                and count_blocks(extents, tiles(block), members) < fill
            ):
                block = tightened([block[0], block[1] // 2, *block[2:]])
        return _Sizes(tiles(block), block)


def _lane_member(
    node: isl.ScheduleNode, scop: Scop, options: MappingOptions, prefix: int, device: DeviceProfile
) -> int | None:
    """The reduction member of a permutable band to spread over the lanes of a warp
    (each lane reduces every 32nd value into a register, the warp then combines its
    lanes with shuffles): one that reads some operand with unit stride and none
    across rows, when no parallel member reads every operand with unit stride
    (threadIdx.x on it would not coalesce). Only where it is
    safe and whole: the band runs one reduction statement (`+ * min max` on a type
    the shuffles move) over a rectangular domain, the member runs at least a warp of
    values, and the options leave the tiles and the block's x to the mapping."""
    if not options.reduce_across_threads or options.tile:
        return None
    if options.map_to_threads and options.map_to_threads[0] != WARP:
        return None
    n = node.band_n_member()
    found = _reduction_statement(node, scop)
    if found is None or found[1].compute not in SHUFFLED:
        return None
    if (
        options.use_shared_memory
        and prefix >= 2
        and _operands_reused(node, scop, prefix)
        and _shared_tiles_fill(node, prefix, device)
    ):
        return None  # a contraction (A * B^T): tiles in shared memory reuse its operands
    if any(worst_stride(node, m, scop) == 2 for m in range(prefix)):
        return None
    for m in range(prefix, n):
        e = member_extent(node, m)
        unit = worst_stride(node, m, scop) >= 0 and stride_score(node, m, scop) >= 2
        if e is not None and e >= WARP and unit:  # some operand walked, none strided
            return m
    return None


def _operands_reused(node: isl.ScheduleNode, scop: Scop, prefix: int) -> bool:
    """Whether every tensor the band reads stays put along one of its `prefix` parallel
    members (the operands of a matrix product, each invariant in one of the output's
    indices): tiles of them in shared memory then save global reads, which a warp per
    output does not."""
    tensors = candidates(node, scop)
    return bool(tensors) and all(
        any(stays_along(node, m, t, scop) for m in range(prefix)) for t in tensors
    )


def _shared_tiles_fill(node: isl.ScheduleNode, prefix: int, device: DeviceProfile) -> bool:
    """Whether the band's parallel members make enough of the narrowest shared-memory
    tiles (`NARROWEST_SHARED_TILE`) to give the device `FILL_WAVES` blocks per SM:
    where they do not, a warp per output keeps more of it busy."""
    outputs = math.prod(member_extent(node, m) or 1 << 20 for m in range(prefix))
    return outputs // NARROWEST_SHARED_TILE >= FILL_WAVES * device.sms


def _reduction_statement(
    node: isl.ScheduleNode, scop: Scop
) -> tuple[ast.Reduction, ScalarType] | None:
    """The operator and element type of the one reduction statement a band runs,
    over a rectangular domain; None when it runs anything else."""
    sets = union_set_sets(node.get_domain())
    if len(sets) != 1 or not sets[0].is_box():
        return None
    stmt = scop.statement(sets[0].get_tuple_name())
    source = stmt.source(scop.cdef)
    if stmt.kind is not Kind.COMPUTE or source.op.reduction is None:
        return None
    return source.op.reduction, scop.cdef.tensor(source.tensor).scalar


def _atomic_reduction(node: isl.ScheduleNode, scop: Scop, options: MappingOptions) -> bool:
    """Whether the band's reduction may be split across blocks, combined by atomics:
    one reduction statement whose operator and element type CUDA has a native atomic
    for (`ATOMICS`), with the options' `split_reductions` and no tiles or grid of
    their own."""
    if not options.split_reductions or options.tile or options.map_to_blocks:
        return False
    found = _reduction_statement(node, scop)
    return found is not None and found in ATOMICS


def _split(blocks: int, threads: int, extent: int | None, device: DeviceProfile) -> int | None:
    """The chunk of a reduction of `extent` values each block of `threads` runs when a
    grid of `blocks` would not fill the device: fewer than `FILL_WAVES` blocks per SM,
    or fewer threads than the device keeps resident (a reduction's threads each walk
    a long chunk: only many of them at once keep enough loads in flight). None when
    it fills it, or when the reduction is too short to give chunks of `MIN_CHUNK`."""
    wanted = max(FILL_WAVES * device.sms, -(-device.resident_threads // max(threads, 1)))
    if extent is None or blocks >= wanted:
        return None
    parts = min(-(-wanted // blocks), extent // MIN_CHUNK)
    return -(-extent // parts) if parts >= 2 else None


def _shared_tile(axis: int, threads: int, register_tile: tuple[int, ...] = ()) -> int:
    """With shared memory, the tile of the member on thread axis `axis` (x, y, z)
    run by `threads` threads: `SHARED_TILE` along x and `SHARED_ROWS` elements per
    thread along y, or the elements per thread `register_tile` gives (its last size
    along x, the one before along y; 0 for one), which `use_private_memory` keeps in
    registers across the reduction."""
    if axis >= 2:
        return threads
    if len(register_tile) > axis:
        return threads * max(1, register_tile[-1 - axis])
    return (SHARED_TILE, threads * SHARED_ROWS)[axis]


def _grid_order(node: isl.ScheduleNode, scop: Scop, prefix: int, mapped: int) -> list[int]:
    """The parallel members of a permutable band reordered for the grid, outermost
    first: innermost the member that walks memory best with unit stride (it goes on
    threadIdx.x, for coalescing), before it the next best (threadIdx.y); ties keep
    the band's order. The `mapped` innermost are those bound to blocks."""
    ranked = sorted(range(prefix), key=lambda m: (stride_score(node, m, scop), m))
    x, y = ranked[-1], (ranked[-2] if prefix > 1 else None)
    rest = [m for m in range(prefix) if m not in (x, y)]
    return [*rest, *([y] if y is not None else []), x]
