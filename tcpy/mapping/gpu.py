"""GPU mapping: loop nests become CUDA kernels, tile loops run on blocks, point loops
on threads.

`map_to_gpu(schedule, scop, options)` expects a valid schedule of `scop` and returns a
`GpuMapping`: the schedule with its mapping filters, and one `Kernel` per top-level
loop nest (a statement sequence at the top of the tree becomes a sequence of kernel
launches, whose boundaries order every dependence between nests).

In each nest (PPCG style) the outermost permutable band is tiled; the coincident prefix
of the tile band is bound to the block parameters `b0, b1, b2` (blockIdx.x, .y, .z) and
the coincident prefix of the point band to the thread parameters `t0, t1, t2`
(threadIdx.x, .y, .z), by filters `member mod size = parameter`: a grid or block smaller
than the loop gives a strided loop, never a wrong result. Only a prefix of coincident
members is mapped, so no dependence crosses threads or blocks; everything below runs
sequentially in its thread (reductions stay sequential in a thread). The member that
walks the innermost array dimension with unit stride goes on threadIdx.x, for
coalescing. A nest with no parallel loop runs in one thread. Launch sizes are
tightened to the loop extents when the sizes are fixed.

The parameters are bounded in each kernel's AST build context (isl's AST generator
here rejects schedule-tree context nodes), and each kernel's AST is built from the
schedule restricted to the kernel's statements.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from tcpy.codegen.naming import BLOCK_PARAMS, THREAD_PARAMS
from tcpy.errors import TCMappingError
from tcpy.mapping.locality import stride_score
from tcpy.mapping.options import MappingOptions
from tcpy.poly.isl_helpers import multi_val, read_set
from tcpy.poly.schedule import member_extent
from tcpy.poly.scop import Scop
from tcpy.poly.transforms import is_band, permute_band

DEFAULT_BLOCK = (32, 8, 1)
DEFAULT_TILE = 32
MAX_GRID = (2**31 - 1, 65535, 65535)
UNKNOWN_GRID = (256, 32, 8)  # blocks per dimension when the loop extents are not known


@dataclass(frozen=True, eq=False, slots=True)
class Kernel:
    index: int
    domain: isl.UnionSet  # the statement instances this kernel runs
    grid: tuple[int, ...]  # blocks along x, y, z (only the mapped dimensions)
    block: tuple[int, ...]  # threads along x, y, z

    @property
    def threads(self) -> int:
        n = 1
        for b in self.block:
            n *= b
        return n

    def launch_dims(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        grid = (*self.grid, 1, 1, 1)[:3]
        block = (*self.block, 1, 1, 1)[:3]
        return (grid[0], grid[1], grid[2]), (block[0], block[1], block[2])


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


def check_options(options: MappingOptions) -> None:
    """Options the CUDA mapping does not implement yet are refused, never ignored."""
    refused = [
        name
        for name in ("use_shared_memory", "use_private_memory", "unroll_copy_shared")
        if getattr(options, name)
    ]
    if refused:
        raise TCMappingError(
            f"the CUDA target does not implement {', '.join(refused)} yet (memory promotion); "
            "set them to false"
        )


def map_to_gpu(schedule: isl.Schedule, scop: Scop, options: MappingOptions) -> GpuMapping:
    check_options(options)
    scop.ctx.set_tile_scale_tile_loops(0)
    unbound = _map_nests(schedule.get_root().child(0), scop, options, [], bind=False)
    kernels: list[Kernel] = []
    bound = _map_nests(schedule.get_root().child(0), scop, options, kernels, bind=True)
    return GpuMapping(bound.get_schedule(), unbound.get_schedule(), tuple(kernels))


def _map_nests(
    node: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    kernels: list[Kernel],
    bind: bool,
) -> isl.ScheduleNode:
    """Map every top-level nest under `node`; returns the node at the same position."""
    if node.get_type() in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
        for i in range(node.n_children()):
            child = _map_nests(node.child(i).child(0), scop, options, kernels, bind)
            node = child.parent().parent()
        return node
    domain = node.get_domain()
    if is_band(node) and node.band_member_get_coincident(0):
        node, grid, block = _map_band(node, scop, options, bind)
    else:
        grid, block = (), ()
    kernels.append(Kernel(len(kernels), domain, grid, block))
    return node


def _map_band(
    node: isl.ScheduleNode, scop: Scop, options: MappingOptions, bind: bool
) -> tuple[isl.ScheduleNode, tuple[int, ...], tuple[int, ...]]:
    n = node.band_n_member()
    coincident = [bool(node.band_member_get_coincident(k)) for k in range(n)]
    prefix = next((k for k in range(n) if not coincident[k]), n)
    if not node.band_get_permutable():
        prefix = min(prefix, 1)
    wanted_blocks = len(options.map_to_blocks) or 3
    mapped = min(prefix, 3, wanted_blocks)
    stride_best = _unit_stride_member(node, scop, list(range(mapped)))
    if node.band_get_permutable() and prefix > 1:
        # the unit-stride member last among the mapped ones: it goes on x
        order = [k for k in range(mapped) if k != stride_best] + [stride_best]
        order += list(range(mapped, n))
        node = permute_band(node, order)
    tile = _tile_sizes(options, n, prefix)
    tiled = node.band_get_permutable() and any(tile)
    if tiled:
        node = node.band_tile(multi_val(node.band_get_space(), [t if t else 1 for t in tile]))
    extents = [member_extent(node, k) for k in range(mapped)]
    grid_option = options.map_to_blocks or ()
    grid = []
    for j in range(mapped):  # x is the last mapped member
        member = mapped - 1 - j
        size = grid_option[j] if j < len(grid_option) else MAX_GRID[j]
        e = extents[member]
        grid.append(min(size, MAX_GRID[j], e) if e is not None else min(size, UNKNOWN_GRID[j]))
    if bind:
        node = _bind(node, [mapped - 1 - j for j in range(mapped)], grid, BLOCK_PARAMS)
    block: list[int] = []
    if tiled:
        point = node.child(0)
        threads = min(mapped, len(options.map_to_threads) or 2)
        block_option = options.map_to_threads or DEFAULT_BLOCK[:threads]
        point_extents = [member_extent(point, k) for k in range(threads)]
        for j in range(threads):
            member = mapped - 1 - j
            size = block_option[j] if j < len(block_option) else 1
            e = point_extents[member] if member < len(point_extents) else None
            block.append(max(1, min(size, e)) if e is not None else size)
        if bind:
            point = _bind(point, [mapped - 1 - j for j in range(threads)], block, THREAD_PARAMS)
            point = point.parent()  # the thread filter
        node = point.parent()  # the tile band
    if bind and mapped:
        node = node.parent()  # the block filter, now at the band's old position
    return node, tuple(grid), tuple(block)


WHOLE = 1 << 30
"""A tile size no loop reaches: the loop stays whole inside the point band."""


def _tile_sizes(options: MappingOptions, n: int, prefix: int) -> list[int]:
    """The options' sizes, else 32 for the parallel loops and, for the others (the
    reductions), one whole tile: their loops then run inside each thread, innermost,
    where the accumulator stays in a register."""
    if options.tile:
        return [options.tile[k] if k < len(options.tile) else 0 for k in range(n)]
    return [DEFAULT_TILE if k < prefix else WHOLE for k in range(n)]


def _bind(
    node: isl.ScheduleNode, members: list[int], sizes: list[int], params: tuple[str, ...]
) -> isl.ScheduleNode:
    """Insert above `node` the filter `member_j mod sizes[j] = params[j]`; returns the
    band node (now below the filter)."""
    if not members:
        return node
    ctx = node.get_ctx()
    mupa = node.band_get_partial_schedule()
    exprs = isl.UnionPwAffList.alloc(ctx, len(members))
    ids = isl.IdList.alloc(ctx, len(members))
    for j, member in enumerate(members):
        upa = mupa.get_union_pw_aff(member).mod_val(isl.Val.int_from_si(ctx, sizes[j]))
        exprs = exprs.add(upa)
        # parameters must be read from text: an isl.Id made in Python is another id
        ids = ids.add(isl.Id.read_from_str(ctx, params[j]))
    space = isl.Space.set_alloc(ctx, 0, len(members)).align_params(mupa.get_space().params())
    values = isl.MultiUnionPwAff.from_union_pw_aff_list(space, exprs)
    filter_ = values.bind(isl.MultiId.from_id_list(space, ids))
    return node.insert_filter(filter_).child(0)


def _unit_stride_member(node: isl.ScheduleNode, scop: Scop, candidates: list[int]) -> int:
    """Among `candidates`, the member that walks memory best with unit stride (the
    last candidate on a tie)."""
    if not candidates:
        return 0
    return max(candidates, key=lambda m: (stride_score(node, m, scop), m))
