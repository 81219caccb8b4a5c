"""isl ASTs of mapped kernels -> one self-contained CUDA translation unit.

Each kernel of a `GpuMapping` becomes `extern "C" __global__ void tc_kernel_<k>`, with
`__launch_bounds__` set to the threads the mapping uses. Its parameters are, in order:
the sizes (`long long`), the buffers (inputs `const`, then outputs and temporaries),
and `int *tc_status`. Index arithmetic is `int` where the sizes show every index fits
(`narrow_indices`), else `long long`. The block and thread parameters of the mapping are spelled
`blockIdx.x`, `threadIdx.x`, ...; innermost loops get `#pragma unroll` when the
options ask for it; a loop that only reduces into one element keeps its accumulator in
a register; tensors that are only read go through `__ldg` with `use_readonly_cache`.
Every global access is written through the access macros (`ACCESS_MACROS`: plain
indexing, which the emulator's instrumented build replaces with checking and counting
hooks). No includes: types are C++'s own and every math function is CUDA's.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from tcpy.codegen import halves, instructions, one_kernel
from tcpy.codegen.ast_build import Ast, PackedBox
from tcpy.codegen.c_helpers import helper_source
from tcpy.codegen.dialect import CUDA, CUDA_NARROW, Dialect
from tcpy.codegen.exprs import BodyPrinter, Helpers, LocalCopy
from tcpy.codegen.isl_exprs import isl_expr, sym_expr
from tcpy.codegen.loops import FOR, Header, loop_count_declarations, walk
from tcpy.codegen.matrix_tile import (
    HeldMatrix,
    find_matrix_nest,
    matrix_below,
    print_held_matrix,
    print_matrix_tile,
)
from tcpy.codegen.one_kernel import Part
from tcpy.codegen.printer import Instance, buffer_order, def_text
from tcpy.codegen.shared_copy import (
    box_offsets,
    print_pipelined_loop,
    print_shared_copy,
    ring_stages,
    store_box,
)
from tcpy.codegen.thread_tile import (
    ThreadPrinter,
    find_thread_tile,
    may_hold,
    print_held_tile,
    print_thread_tile,
)
from tcpy.errors import InternalError
from tcpy.mapping.gpu import GpuMapping, MappedKernel
from tcpy.mapping.gpu.device import WARP
from tcpy.mapping.marks import (
    Atomic,
    Lanes,
    LaneZero,
    Mark,
    MatrixTile,
    Private,
    Rows,
    Scratch,
    Shared,
    ThreadRegisters,
    of_ast,
)
from tcpy.mapping.options import MappingOptions
from tcpy.naming import BLOCK_PARAMS, THREAD_PARAMS, extent_name, size_name, tensor_name
from tcpy.parser import ast as tc
from tcpy.parser.checked import Role
from tcpy.poly.isl_helpers import ast_children, statement_names, union_map_maps
from tcpy.poly.scop import Scop

_AXES = ("x", "y", "z")
_ATOMIC_FUNCTIONS = {
    tc.Reduction.SUM: "atomicAdd",
    tc.Reduction.MAX: "atomicMax",
    tc.Reduction.MIN: "atomicMin",
}

# Global and shared accesses go through these macros: plain indexing here (NVRTC); the
# emulator's header defines hooks in their place for its checking and counting build.
# TC_LD/TC_ST: a global load/store (TC_ST is an lvalue), TC_LDG through the read-only
# cache, TC_LDV/TC_STV a vector load/store (`TC_LDV(float4, a, i)`), TC_AT the address
# of an atomic; TC_SLD/TC_SLDV/TC_SST/TC_SAT the same on a shared array;
# TC_DYNAMIC_SHARED declares the dynamic shared memory.
ACCESS_MACROS = r"""#ifndef TC_ACCESS_MACROS
#define TC_ACCESS_MACROS
#define TC_LD(a, i) ((a)[i])
#define TC_LDG(a, i) __ldg(&(a)[i])
#define TC_ST(a, i) ((a)[i])
#define TC_AT(a, i) (&(a)[i])
#define TC_LDV(T, a, i) (*reinterpret_cast<const T *>(&(a)[i]))
#define TC_STV(T, a, i) (*reinterpret_cast<T *>(&(a)[i]))
#define TC_SLD(s, i) ((s)[i])
#define TC_SLDV(T, s, i) (*reinterpret_cast<const T *>(&(s)[i]))
#define TC_SST(s, i) ((s)[i])
#define TC_SAT(s, i) (&(s)[i])
#endif
#ifndef TC_DYNAMIC_SHARED
#define TC_DYNAMIC_SHARED(T, s) extern __shared__ __align__(16) T s[]
#endif
"""


@dataclass
class CudaPrinter(ThreadPrinter):
    """CUDA: a kernel's code as each of its threads runs it. Marks print the block's
    shared-memory copies (`shared:`), a row kernel's scratch arrays and warp
    synchronisation (`scratch:`, `warp_rows`), reductions shared by lanes or blocks
    (`lane_reduction`, `atomic_reduction`) and held register tiles (`private`)."""

    rows: bool = False  # inside a row kernel's statements (`marks.Rows`)
    matrix: HeldMatrix | None = None  # under a `private` mark above a matrix tile

    def if_(self, node: isl.AstNode, depth: int, marks: tuple[Mark, ...]) -> None:
        """A guard on thread indices above a shared-memory copy (isl hoists the
        conditions that only involve parameters as far out as it can) is sunk into
        the copy's scope, around the statements only: every thread of the block must
        run the copy and reach its barriers. The guard does not change below it, so
        this is the same program. Each branch of such a guard is printed so
        (`_branch`), the `else` under the guard negated. Inside a row kernel every
        guard on the thread is sunk to its statements, which the warp then runs in
        its order with a `__syncwarp()` between; one with an `else` (isl splitting
        the row's statements by lane) cannot be, and raises `RowsOutOfStep`."""
        cond = isl_expr(node.if_get_cond(), self.names, top=True)
        then = node.if_get_then_node()
        other = node.if_get_else_node() if node.if_has_else_node() else None
        if "threadIdx" in cond and other is not None and (self.rows or _has_rows(node)):
            raise RowsOutOfStep("a row kernel's statements split by lane")
        copies = _all_threads(then) or (other is not None and _all_threads(other))
        if "threadIdx" not in cond or not (copies or self.rows):
            self.divergent += "threadIdx.x" in cond
            super().if_(node, depth, marks)
            self.divergent -= "threadIdx.x" in cond
            return
        self._branch(cond, then, depth, marks)
        if other is not None:
            self._branch(f"!({cond})", other, depth, marks)

    def _branch(self, cond: str, node: isl.AstNode, depth: int, marks: tuple[Mark, ...]) -> None:
        """`node` run where `cond` (on thread indices) holds: every thread runs the
        copies into shared memory below it, with `cond` sunk around the statements
        (`shared_copy`); where it has none, all of it runs under `cond` and the guards
        sunk so far."""
        if _all_threads(node) or self.rows:
            self.sunk.append(cond)
            self.node(node, depth, marks)
            self.sunk.pop()
            return
        guards, self.sunk = [*self.sunk, cond], []
        diverges = any("threadIdx.x" in c for c in guards)
        self.emit(depth, f"if ({' && '.join(f'({c})' for c in guards)}) {{")
        self.divergent += diverges
        self.node(node, depth + 1, marks)
        self.divergent -= diverges
        self.emit(depth, "}")
        self.sunk = guards[:-1]

    def for_(
        self, node: isl.AstNode, depth: int, marks: tuple[Mark, ...], shared: str | None = None
    ) -> None:
        loop = self.loop_header(node)
        header = loop.text
        if self.sunk and _has_shared_mark(node) and "threadIdx" in header:
            raise SharedCopyInDivergentLoop(
                "a loop whose bounds depend on the thread around a shared copy"
            )
        self.divergent += "threadIdx.x" in header
        tile = next((m for m in reversed(marks) if isinstance(m, ThreadRegisters)), None)
        jam = find_thread_tile(self, node, tile.outputs, tile.steps) if tile else None
        held = self.held
        if jam is not None and held is not None and held.tile is None and may_hold(held, jam):
            held.tile = jam
            print_thread_tile(self, jam, depth, held=True)
        elif jam is not None:
            print_thread_tile(self, jam, depth)
        else:
            if held is not None and held.tile is None:
                held.iterators.append(loop.id)
            stages = ring_stages(self, node, header)
            if stages > 1:
                print_pipelined_loop(self, node, loop, depth, marks, stages)
            else:
                super().for_(node, depth, marks, shared)
        self.divergent -= "threadIdx.x" in header

    def node(self, node: isl.AstNode, depth: int, marks: tuple[Mark, ...] = ()) -> None:
        if node.get_type() == isl.ast_node_type.block and self.rows and not self.divergent:
            for child in ast_children(node):  # the statements of a row kernel, in order
                self.node(child, depth, marks)
                self.emit(depth, "__syncwarp();")
        else:
            super().node(node, depth, marks)

    def mark(self, mark: Mark, node: isl.AstNode, depth: int, marks: tuple[Mark, ...]) -> None:
        inner = node.mark_get_node()
        if isinstance(mark, Lanes) and self.divergent:
            raise InternalError("a reduction over a warp's lanes where some lanes do not reach it")
        if isinstance(mark, Lanes | Atomic):
            self.partial_reduction(inner, depth, marks, lanes=isinstance(mark, Lanes))
        elif isinstance(mark, Shared):
            print_shared_copy(self, self.ast.packed(node), inner, depth, marks)
        elif isinstance(mark, Scratch):
            self.scratch(mark, self.ast.packed(node), inner, depth, marks)
        elif isinstance(mark, Private) and (tile := matrix_below(inner)) is not None:
            self.matrix, outer = HeldMatrix(tile), self.matrix
            print_held_matrix(self, tile, inner, depth, marks, self.matrix)
            self.matrix = outer
        elif isinstance(mark, Private):
            print_held_tile(self, inner, depth, marks)
        elif isinstance(mark, MatrixTile):
            if self.matrix is None:  # the mapping holds the accumulators above
                raise InternalError("a matrix tile without a private mark above it")
            self.matrix.nest = find_matrix_nest(self, mark, inner)
            print_matrix_tile(self, self.matrix.nest, depth)
        elif isinstance(mark, Rows):
            self.rows, saved = True, self.rows
            self.node(inner, depth, marks)
            self.rows = saved
        elif isinstance(mark, LaneZero):
            self.emit(depth, "if (threadIdx.x == 0) {")
            self.divergent += 1
            self.node(inner, depth + 1, marks)
            self.divergent -= 1
            self.emit(depth, "}")
        else:
            super().mark(mark, node, depth, marks)

    def scratch(
        self,
        mark: Scratch,
        boxes: tuple[PackedBox, ...],
        inner: isl.AstNode,
        depth: int,
        marks: tuple[Mark, ...],
    ) -> None:
        """A block's slices of temporaries that live and die in a row kernel
        (`tcpy.mapping.gpu.rows`), in shared memory: `inner` writes and reads them there
        instead of in global memory. Each warp touches only its rows' slices, so no
        barrier of the block is needed, but for the outputs computed there
        (`mark.stored`): once every warp is done, the block stores their boxes, each
        thread every `threads`-th element inside the tensor (coalesced)."""
        self.emit(depth, "{")
        places = {}
        for b in boxes:
            buffer = f"tc_scratch{self.copies}"
            self.copies += 1
            scalar = self.scop.cdef.tensor(b.tensor).scalar
            self.declare_shared(depth + 1, scalar, buffer, math.prod(b.sizes))
            places[b.tensor] = LocalCopy(buffer, box_offsets(self, depth + 1, buffer, b), b.sizes)
        saved = self.bodies
        self.bodies = dataclasses.replace(saved, copies={**saved.copies, **places})
        self.node(inner, depth + 1, marks)
        self.bodies = saved
        stored = [b for b in boxes if b.tensor in mark.stored]
        if stored:
            assert self.kernel is not None
            self.emit(depth + 1, self.barrier)
            for b in stored:
                store_box(self, depth + 1, b, places[b.tensor], max(1, self.kernel.threads))
            self.emit(depth + 1, self.barrier)
        self.emit(depth, "}")

    def partial_reduction(
        self, inner: isl.AstNode, depth: int, marks: tuple[Mark, ...], lanes: bool
    ) -> None:
        """A reduction shared by several threads (`tcpy.mapping.gpu`): each reduces
        its instances into a register, from the identity. Over the lanes of a warp
        (`lanes`), the warp combines the partial results by a butterfly of shuffles,
        outside every loop and guard of the subtree, where all 32 lanes arrive, and
        lane 0 combines the total into the element when some lane had an instance (a
        guard may leave a whole row out). Split across blocks, each thread that had
        an instance adds its partial result with an atomic. Every instance under the
        mark reduces into one element, which the mapping guarantees and this
        checks."""
        users, iterators = _users_and_iterators(inner)
        found = [self.reduction_at(u) for u in users]
        first = found[0] if found else None
        if first is None or any(f is None or not f.same(first) for f in found):
            raise InternalError("a partial reduction must run instances of one reduction")
        if first.element_uses(*iterators):
            raise InternalError("a partial reduction must reduce into one element")
        parts = self.bodies.parts(first.source, first.values)
        self.emit(depth, "{")
        self.emit(depth + 1, f"{parts.compute} tc_part = {parts.identity};")
        self.emit(depth + 1, "bool tc_seen = false;")
        self.lane_parts = parts
        self.node(inner, depth + 1, marks)
        self.lane_parts = None
        if not lanes:
            assert parts.reduction is not None
            atomic = _ATOMIC_FUNCTIONS[parts.reduction]
            self.emit(depth + 1, "if (tc_seen) {")
            self.emit(depth + 2, f"{atomic}({parts.address}, tc_part);")
            self.emit(depth + 1, "}")
            self.emit(depth, "}")
            return
        shuffled = "__shfl_xor_sync(0xffffffffu, tc_part, tc_lane)"
        self.emit(depth + 1, f"for (int tc_lane = {WARP // 2}; tc_lane > 0; tc_lane /= 2) {{")
        self.emit(depth + 2, f"tc_part = {parts.merge('tc_part', shuffled)};")
        self.emit(depth + 1, "}")
        self.emit(depth + 1, "const bool tc_any = __any_sync(0xffffffffu, tc_seen);")
        self.emit(depth + 1, "if (tc_any && threadIdx.x == 0) {")
        total = parts.store(parts.merge(parts.current, "tc_part"))
        self.emit(depth + 2, f"{parts.target} = {total};")
        self.emit(depth + 1, "}")
        self.emit(depth, "}")

    def user(self, node: isl.AstNode, depth: int) -> None:
        if self.sunk:  # a statement beside a copy, below a guard sunk into that copy
            guards, self.sunk = self.sunk, []
            self.emit(depth, f"if ({' && '.join(f'({c})' for c in guards)}) {{")
            self.user(node, depth + 1)
            self.emit(depth, "}")
            self.sunk = guards
            return
        if self.lane_parts is None:
            super().user(node, depth)
            return
        found = self.reduction_at(node)
        assert found is not None
        parts = self.bodies.parts(found.source, found.values)
        self.emit(depth, parts.wrap(f"tc_part = {parts.combine('tc_part')};"))
        self.emit(depth, "tc_seen = true;")

    def promoted(self, instance: Instance, loop: Header, depth: int) -> None:
        """A reduction loop with its accumulator in a register, below guards sunk from
        above a row kernel (`_branch`): the loop, its load and its store under them."""
        if not self.sunk:
            super().promoted(instance, loop, depth)
            return
        guards, self.sunk = self.sunk, []
        self.emit(depth, f"if ({' && '.join(f'({c})' for c in guards)}) {{")
        super().promoted(instance, loop, depth + 1)
        self.emit(depth, "}")
        self.sunk = guards

    def accumulator(self, body: isl.AstNode, loop: Header) -> Instance | None:
        return None if self.lane_parts is not None else super().accumulator(body, loop)

    def pragmas(
        self, marks: tuple[Mark, ...], innermost: bool, unroll: int, shared: str | None = None
    ) -> list[str]:
        if innermost and unroll > 1:
            return [f"#pragma unroll {unroll}"]
        return []

    def reduction_pragmas(self, clause: str) -> list[str]:
        return []


def kernel_name(kernel: MappedKernel) -> str:
    return f"tc_kernel_{kernel.index}"


class RowsOutOfStep(InternalError):
    """A row kernel whose AST isl split by lane (an `if` on the thread with an `else`):
    each lane's part would run the row's statements in its own order, out of step
    with the warp's `__syncwarp()`s. The lowering maps the def again without row
    fusion, then without row kernels (`tcpy.pipeline.lower_to_cuda`)."""


class SharedCopyInDivergentLoop(InternalError):
    """A shared-memory copy (and its barriers) under a loop whose bounds differ from
    thread to thread: a barrier some threads would not reach. The lowering maps the
    def again without shared memory (`tcpy.pipeline.lower_to_cuda`)."""


def kernel_parameters(scop: Scop, narrow: bool = False) -> list[str]:
    """The C parameter list shared by every kernel of a definition. The sizes come
    as `long long`; a `narrow` kernel takes them under names of its own
    (`tc_size<k>`) and declares the sizes' names as `int` (`size_locals`)."""
    cdef = scop.cdef
    params = [
        f"long long {f'tc_size{k}' if narrow else size_name(p)}" for k, p in enumerate(scop.params)
    ]
    for name in buffer_order(scop.cdef):
        info = cdef.tensor(name)
        const = "const " if info.role is Role.INPUT else ""
        params.append(f"{const}{CUDA.ctype(info.scalar)} *__restrict__ {tensor_name(name)}")
    params.append("int *tc_status")
    return params


def print_cuda(
    scop: Scop,
    mapping: GpuMapping,
    asts: list[Ast],
    options: MappingOptions,
    sizes: Mapping[str, int] | None,
    count_loops: bool = False,
) -> str:
    """The CUDA translation unit of a mapped definition; with `sizes`, the sizes are
    constants; `count_loops`: a counting build, for the emulator only
    (`tcpy.codegen.loops.COUNT_LOOP`)."""
    cdef = scop.cdef
    narrow = narrow_indices(scop, options, sizes)
    dialect = CUDA_NARROW if narrow else CUDA
    one = one_kernel_threads(mapping, options)
    kernels: list[str] = []
    parts: list[Part] = []
    helpers: Helpers | None = None
    counted = 0
    for kernel, ast in zip(mapping.kernels, asts, strict=True):
        printer = CudaPrinter(scop, ast, options, dialect=dialect, count_loops=count_loops)
        printer.counted = counted
        if one:
            printer.barrier = one_kernel.barrier(kernel, one)
            printer.shared_pool = True
        kernels.append(_kernel(printer, kernel, helpers, narrow, part=bool(one)))
        helpers, counted = printer.helpers, printer.counted
        in_step = kernel.matrix or printer.shared_bytes > 0 or _all_threads(ast.root)
        parts.append(Part(kernel, in_step, printer.shared_bytes))
    if one:
        refused = one_kernel.refusal(parts, one)
        if refused is not None:
            raise OneKernelRefused(refused)
        kernels.append(one_kernel.driver(parts, kernel_parameters(scop, narrow), one))
    header = [
        f"/* {cdef.name}: generated by tcpy for CUDA from */",
        *(f"/*   {line.replace('*/', '* /')} */" for line in def_text(cdef).splitlines()),
        "",
        ACCESS_MACROS,
        *([halves.CUDA_HALF_TYPES] if halves.half_types(cdef) else []),
        *([instructions.CUDA_INSTRUCTIONS] if instructions.needed("".join(kernels)) else []),
        *([one_kernel.GRID_INSTRUCTIONS] if one else []),
        *([loop_count_declarations(counted, cxx=True)] if count_loops else []),
        helper_source(helpers, dialect) if helpers is not None else "",
        *([one_kernel.pool(parts)] if one else []),
    ]
    return "\n".join([*header, *kernels, ""])


class OneKernelRefused(InternalError):
    """The kernels of a def cannot run as one (`tcpy.codegen.one_kernel.refusal`):
    the lowering prints them again as kernels of their own."""


def one_kernel_threads(mapping: GpuMapping, options: MappingOptions) -> int:
    """The threads of the one kernel's block where the def's kernels run as one
    (`MappingOptions.one_kernel`, and more than one kernel), else 0."""
    if not options.one_kernel or len(mapping.kernels) < 2:
        return 0
    return one_kernel.block_threads(mapping.kernels)


def _kernel(
    printer: CudaPrinter,
    kernel: MappedKernel,
    helpers: Helpers | None,
    narrow: bool,
    part: bool = False,
) -> str:
    """One `__global__` function: `kernel`'s code, printed by `printer` (sharing the
    `helpers` of the kernels before it), its indices `narrow` or not; a `part` of one
    kernel, a device function (`tcpy.codegen.one_kernel.part_function`)."""
    scop, dialect, cdef = printer.scop, printer.dialect, printer.scop.cdef
    if helpers is not None:
        printer.helpers = helpers
    readonly = (
        frozenset(t.name for t in cdef.inputs)
        if printer.options.use_readonly_cache
        else frozenset()
    )
    printer.bodies = BodyPrinter(cdef, dialect, printer.helpers, readonly, hoist_loads=True)
    printer.names.update(_launch_names(kernel, dialect))
    printer.kernel = kernel
    body: list[str] = []
    printer.lines = body
    if narrow:
        for k, p in enumerate(scop.params):
            printer.emit(1, f"const int {size_name(p)} = (int)tc_size{k};")
    touched = _touched(scop, kernel)
    for name in (n for n in buffer_order(cdef) if tensor_name(n) in touched):
        for d, extent in enumerate(cdef.tensor(name).shape):
            printer.emit(
                1, f"const {dialect.index_type} {extent_name(name, d)} = {sym_expr(extent)};"
            )
    printer.top_level(1)
    if part:
        return one_kernel.part_function(kernel, kernel_parameters(scop, narrow), body)
    bounds = max(1, kernel.threads)
    signature = ", ".join(kernel_parameters(scop, narrow))
    launch = f'extern "C" __global__ void __launch_bounds__({bounds}) '
    return "\n".join([f"{launch}{kernel_name(kernel)}({signature}) {{", *body, "}"])


def _touched(scop: Scop, kernel: MappedKernel) -> set[str]:
    """The tensors (`tensor_name`s) `kernel`'s statements and epilogue read or write:
    the only ones whose extents its code declares (a layer of many tensors and kernels
    would otherwise declare every extent in every kernel)."""
    names = {*statement_names(kernel.domain), *kernel.epilogue}
    accesses = scop.reads.union(scop.writes)
    return {
        m.get_tuple_name(isl.dim_type.out)
        for m in union_map_maps(accesses)
        if m.get_tuple_name(isl.dim_type.in_) in names
    }


_INTEGER = re.compile(r"(?<![\w.])\d+(?![\w.])")
NARROW_HEADROOM = 8
"""How far below 2^31 the numbers a narrow kernel computes with must stay: an index
expression adds a few terms, each at most a size times a coefficient."""


def narrow_indices(scop: Scop, options: MappingOptions, sizes: Mapping[str, int] | None) -> bool:
    """Whether a kernel compiled for `sizes` can do its index arithmetic in 32 bits:
    every tensor's element count (the largest flat index of an element in range) and
    every size, tile size and integer of the def times the largest of those integers
    (a subscript `2*i + 2`, a guard isl derives from it) stay `NARROW_HEADROOM` times
    below 2^31. A kernel for every size (`sizes` None) stays 64-bit. An index read
    from a tensor (a gather) is checked in 64 bits before it is used."""
    if sizes is None:
        return False
    limit = 2**31 // NARROW_HEADROOM
    cdef = scop.cdef
    elements = [math.prod(d.evaluate(sizes) for d in t.shape) for t in cdef.tensors]
    # the def's integers as written (a float's digits and a name's are no index's)
    literals = [int(n) for n in _INTEGER.findall(def_text(cdef))]
    scale = max([1, *literals])
    largest = max([1, *sizes.values(), *options.tile, *literals])
    return max(elements, default=0) < limit and largest * scale < limit


def _launch_names(kernel: MappedKernel, dialect: Dialect) -> dict[str, str]:
    index = dialect.index_type
    names = {p: f"({index}){kernel.block_index(j)}" for j, p in enumerate(BLOCK_PARAMS)
             if j < len(kernel.grid)}  # fmt: skip
    names.update({p: f"({index})threadIdx.{a}" for p, a in zip(THREAD_PARAMS, _AXES, strict=True)})
    return names


def _users_and_iterators(node: isl.AstNode) -> tuple[list[isl.AstNode], list[str]]:
    """The user nodes under `node`, and the iterators of the loops under it."""
    nodes = [n for n, _ in walk(node)]
    users = [n for n in nodes if n.get_type() == isl.ast_node_type.user]
    loops = [n for n in nodes if n.get_type() == FOR]
    return users, [n.for_get_iterator().get_id().get_name() for n in loops]


def _has_shared_mark(node: isl.AstNode) -> bool:
    return any(isinstance(of_ast(n), Shared) for n, _ in walk(node))


def _has_rows(node: isl.AstNode) -> bool:
    """Whether a row kernel's statements (`warp_rows`) are below `node`."""
    return any(isinstance(of_ast(n), Rows) for n, _ in walk(node))


def _all_threads(node: isl.AstNode) -> bool:
    """Whether every thread of the block (a shared copy's barriers), or of a warp (a
    row kernel's `__syncwarp()`, a lane reduction's shuffles), must reach code below
    `node`."""
    return any(isinstance(of_ast(n), Shared | Rows | Lanes) for n, _ in walk(node))
