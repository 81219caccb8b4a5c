"""The CPU's loop marks: the worksharing loop of each nest (`omp for`, with the loop
inside it where the two share out as one) and the vector loops (`omp simd`)."""

from __future__ import annotations

import islpy as isl

from tcpy.mapping import marks
from tcpy.poly.schedule import member_extent
from tcpy.poly.transforms import is_band


def _mark(node: isl.ScheduleNode, kind: type[marks.LoopMark], member: int) -> isl.ScheduleNode:
    """Mark band member `member` with a loop mark of `kind`, which names the member's
    schedule depth: the loop the pragma belongs to (isl drops loops of a single
    iteration, so the first loop under a mark may come from elsewhere). Returns the
    mark node."""
    depth = node.get_schedule_depth() + member
    return marks.insert(node, kind(depth)).parent()


def mark_simd(node: isl.ScheduleNode) -> isl.ScheduleNode:
    last = node.band_n_member() - 1
    if not node.band_member_get_coincident(last):
        return node
    return _mark(node, marks.Simd, last)


def mark_parallel(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """Mark the first coincident member of the outermost band of every nest (looking
    deeper where a band has none), and the member after it when that one is coincident
    too (`omp_collapse`: the printer shares both loops out as one where the second is
    directly inside the first and its bounds do not depend on it); returns the node at
    the position it was given. A size-generic MLP of 256 rows made one tile of rows
    and ran on one thread without it."""
    if is_band(node):
        n = node.band_n_member()
        # a loop of one iteration (a single tile) is dropped by isl: look past it
        first = next(
            (
                k
                for k in range(n)
                if node.band_member_get_coincident(k) and member_extent(node, k) != 1
            ),
            None,
        )
        if first is not None:
            marked = _mark(node, marks.Parallel, first)
            if first + 1 < n and node.band_member_get_coincident(first + 1):
                marked = _mark(marked.child(0), marks.Collapse, first + 1).parent()
            return marked
    for i in range(node.n_children()):
        node = mark_parallel(node.child(i)).parent()
    return node
