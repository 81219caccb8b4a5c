"""Where a GPU kernel's tile band gets its copies into shared memory and its
threads' register tiles: marks placed at a depth of the band (its members on the grid
first, then the reduction's tile loops), the band split there (`shared_depth`,
`private_depth`). A mark runs once per iteration of the members above it: a copy made
above a reduction's tile loops holds the operands over all of them, a register tile
loaded above them is held across them (`tcpy.codegen.thread_tile.print_held_tile`).
"""

from __future__ import annotations

import islpy as isl

from tcpy.mapping import marks
from tcpy.mapping.gpu.device import DeviceProfile
from tcpy.mapping.gpu.shared import shared_tensors, worth_sharing
from tcpy.mapping.locality import turned_reads, walked_reads
from tcpy.mapping.options import MappingOptions
from tcpy.mapping.promotion import box_at, within_budget
from tcpy.poly.schedule import member_extent
from tcpy.poly.scop import Scop
from tcpy.poly.transforms import is_band

VECTOR_RUNS = (2, 4)
"""The runs of adjacent outputs a thread may take along x: a `float2` or a `float4`."""


MAX_THREAD_TILE = 64
"""The most outputs a thread keeps in registers across a reduction (`use_private_memory`);
more would spill them to local memory."""


WORD = 4
"""The bytes of the elements a thread reads as `float4`/`int4` vectors."""

VECTOR_STEPS = (4, 2)
"""The steps of its innermost reduction loop a thread may take at a time, reading an
operand along them as a `float4` or a `float2`."""


def thread_tile(
    tiles: list[int | None], block: list[int], steps: int = 1
) -> marks.ThreadRegisters | None:
    """The register tile of a thread of a block of `block` threads (x first) over
    point loops of `tiles` values (None: known at the call only), each strided by
    the block along its member: the outputs the thread computes one after another,
    at most `MAX_THREAD_TILE`, its reduction taken `steps` at a time
    (`reduction_steps`); None where they are more or not known."""
    outputs = 1
    for values, threads in zip(tiles, block, strict=False):  # members beyond the block: none
        if values is None:
            return None
        outputs *= -(-values // threads)
    return marks.ThreadRegisters(outputs, steps) if outputs <= MAX_THREAD_TILE else None


def reduction_steps(
    node: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    member: int,
    tile: int | None,
    rows: int | None,
) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
    """How many steps of a thread's innermost reduction loop, band `member` of `node`
    (untiled), it takes at a time (`marks.ThreadRegisters.steps`), the tensors it then
    reads as vectors along them (`locality.walked_reads`: `A(m,k)` along `k`, a
    thread's rows of A as `float4`s where adjacent and aligned; 4-byte elements
    only), and those whose copies are turned to make them so
    (`locality.turned_reads`: `A(k,m)`, whose last subscript walks the thread's rows,
    member `rows`): with `vectorize`, where some
    tensor is so read and the loop runs `tile` values (None, or a tile beyond it: the
    member's whole extent; 0: one) that divide the extent, so that its bounds are
    constant, and divide into 4 (or 2) steps. Else 1 and none."""
    extent = member_extent(node, member)
    steps = extent if tile is None or extent is None or tile >= extent else tile
    if not options.vectorize or not steps or extent is None or extent % steps:
        return 1, (), ()
    # only 4-byte elements are read as `float4`s (a turned copy, an element at a time,
    # pays only for them; a half operand's copy keeps its pairs)
    words = {t.name for t in scop.cdef.tensors if t.scalar.dtype.itemsize == WORD}
    walked = walked_reads(node, member, scop) & words
    turned = set() if rows is None else (turned_reads(node, member, rows, scop) & words) - walked
    found = next((s for s in VECTOR_STEPS if steps % s == 0), 1)
    if found == 1 or not walked | turned:
        return 1, (), ()
    return found, tuple(sorted(walked | turned)), tuple(sorted(turned))


def hold_registers(band: isl.ScheduleNode, depth: int, first: int) -> isl.ScheduleNode:
    """Mark where a thread's register tile is loaded and stored (`marks.Private`):
    below the first `depth` members of the tile `band` (0: its `first`, those on the
    grid). None below them all: the tile is then loaded and stored within each tile,
    where the thread computes it. Returns the node at the band's position."""
    n = _members(band)
    depth = depth_in_band(depth, first, n)
    return mark_at(band, depth, marks.Private()) if depth < n else band


def plan_copies(
    band: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    budget: int,
    first: int,
    x_member: int,
) -> tuple[int, list[str], bool]:
    """Where the block of the tile `band` copies its operands into shared memory, and
    which: below the first `shared_depth` members of the band (0: below them all, a
    copy per tile of the reduction; a depth among the grid's `first` members is
    theirs). A copy above a reduction's tile loops holds its whole extent: where the
    operands copied per tile do not all fit `budget` bytes there, the copies stay per
    tile. `x_member`: the member on threadIdx.x. Returns the depth, the tensors copied
    and whether every tensor worth copying per tile (`shared.worth_sharing`) fits the
    budget."""
    n = _members(band)
    wanted = worth_sharing(_at_depth(band, n), scop, x_member)
    copied = within_budget(_at_depth(band, n), wanted, scop, budget)
    complete = len(copied) == len(wanted)
    depth = depth_in_band(options.shared_depth, first, n, default=n)
    if depth < n:
        above = shared_tensors(_at_depth(band, depth), scop, budget, x_member)
        depth = depth if set(above) >= set(copied) else n
        copied = above if depth < n else copied
    return depth, copied, complete


def copy_into_shared(
    band: isl.ScheduleNode, depth: int, tensors: tuple[str, ...], stages: int = 1
) -> isl.ScheduleNode:
    """Mark where the block of the tile `band` copies `tensors` into shared memory
    (`marks.Shared`) into a ring of `stages` buffers, below the first `depth` members
    of the band, as `plan_copies` and `copy_stages` decided (none: no mark). Returns
    the node at the band's position."""
    return mark_at(band, depth, marks.Shared(tensors, stages)) if tensors else band


ASYNC_COPY_ARCH = 80
"""The first compute capability with `cp.async` (sm_80)."""


def wanted_stages(options: MappingOptions, device: DeviceProfile) -> int:
    """The stages `copy_stages` asks for, on a device with `cp.async`; else 1."""
    arch = int(device.arch.removeprefix("sm_")[:2])
    return options.copy_stages if arch >= ASYNC_COPY_ARCH else 1


def copy_stages(
    band: isl.ScheduleNode,
    depth: int,
    tensors: tuple[str, ...],
    scop: Scop,
    options: MappingOptions,
    device: DeviceProfile,
    budget: int,
) -> int:
    """The buffers of the ring the copies of `tensors` below the first `depth` members
    of the tile `band` fill: `copy_stages`, fewer where that many copies do not fit
    `budget` bytes together, and 1 on a device without `cp.async` (before sm_80).
    Codegen pipelines the copies where the mark is the body of a loop (a reduction's
    tile loop); elsewhere one buffer serves."""
    if wanted_stages(options, device) == 1:
        return 1
    node = _at_depth(band, depth)
    total = 0
    for t in tensors:
        b = box_at(node, t, scop)
        if b is None:
            return 1
        total += b.elements * scop.cdef.tensor(t).scalar.dtype.itemsize
    stages = options.copy_stages
    while stages > 1 and stages * total > budget:
        stages -= 1
    return stages


def thread_runs(
    point: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    budget: int,
    read: set[str],
    threads: int,
    tile: int,
    extent: int | None,
) -> int:
    """How many adjacent outputs along threadIdx.x's member each thread of a tile
    computes (`MappedKernel.runs`): with `vectorize` and `use_private_memory`, where the
    tile along the member is 2 or 4 times the threads (a register tile) and the
    tensors `read` along it (`locality.runs_along`) are all copied into shared
    memory at `point` (the tile's point band), a thread's run is then loaded, stored
    and read from shared memory as one vector (`tcpy.codegen.thread_tile`), where the
    tiles divide the member's `extent` (a partial tile, or a size known only at the
    call, moves its runs one element at a time). Else 1: its outputs are strided by
    the block, so that scalar accesses of a warp stay adjacent."""
    run = tile // threads if threads and tile % threads == 0 else 1
    if run not in VECTOR_RUNS or not (options.vectorize and options.use_private_memory):
        return 1
    if extent is None or extent % tile:
        return 1
    return run if read <= set(shared_tensors(point, scop, budget)) else 1


def depth_in_band(asked: int, first: int, n: int, default: int | None = None) -> int:
    """A depth of `shared_depth` or `private_depth` in a tile band of `n` members whose
    `first` are on the grid: 0 is `default` (else `first`); others are clamped."""
    if not asked:
        return first if default is None else default
    return min(max(asked, first), n)


def _members(top: isl.ScheduleNode) -> int:
    """The members of the tile band from `top` down (split, with marks between)."""
    n, node = 0, top
    while is_band(node) or node.get_type() == isl.schedule_node_type.mark:
        n += node.band_n_member() if is_band(node) else 0
        node = node.child(0)
    return n


def _at_depth(top: isl.ScheduleNode, depth: int) -> isl.ScheduleNode:
    """The node below the first `depth` members of the bands from `top` down (the tile
    band, split there if needed, and the marks already in it): a mark placed there
    runs once per iteration of those members. At `depth` 0, `top`; beyond them all,
    the node that follows them (the thread filter)."""
    node = top
    while True:
        if is_band(node):
            if depth == 0:
                return node
            if depth < node.band_n_member():
                return node.band_split(depth).child(0)
            depth -= node.band_n_member()
        elif node.get_type() != isl.schedule_node_type.mark or depth == 0:
            return node
        node = node.child(0)


def mark_at(top: isl.ScheduleNode, depth: int, mark: marks.Mark) -> isl.ScheduleNode:
    """Insert `mark` at `_at_depth(top, depth)`, above a mark already there; returns
    the node at `top`'s position."""
    level = top.get_tree_depth()
    node = marks.insert(_at_depth(top, depth), mark)
    while node.get_tree_depth() > level:
        node = node.parent()
    return node
