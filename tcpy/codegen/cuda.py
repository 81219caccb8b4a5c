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
from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from tcpy.codegen import halves, instructions
from tcpy.codegen.ast_build import Ast, PackedBox
from tcpy.codegen.c_helpers import helper_source
from tcpy.codegen.dialect import CUDA, CUDA_NARROW, Dialect
from tcpy.codegen.exprs import (
    BodyPrinter,
    Helpers,
    LocalCopy,
    flat_index,
    isl_expr,
    sym_expr,
)
from tcpy.codegen.loops import FOR, Header, loop_count_declarations, walk
from tcpy.codegen.printer import Instance, buffer_order, def_text
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
    Mark,
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
from tcpy.poly.isl_helpers import ast_children
from tcpy.poly.scop import Scop
from tcpy.types import ScalarType

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

    sunk: list[str] = dataclasses.field(default_factory=list)  # guards moved into a copy
    rows: bool = False  # inside a row kernel's statements (`marks.Rows`)
    divergent: int = 0  # loops and guards on threadIdx.x around the code being printed

    def if_(self, node: isl.AstNode, depth: int, marks: tuple[Mark, ...]) -> None:
        """A guard on thread indices above a shared-memory copy (isl hoists the
        conditions that only involve parameters as far out as it can) is sunk into
        the copy's scope, around the statements only: every thread of the block must
        run the copy and reach its barriers. The guard does not change below it, so
        this is the same program. Each branch of such a guard is printed so
        (`_branch`), the `else` under the guard negated."""
        cond = isl_expr(node.if_get_cond(), self.names, top=True)
        then = node.if_get_then_node()
        other = node.if_get_else_node() if node.if_has_else_node() else None
        copies = _has_shared_mark(then) or (other is not None and _has_shared_mark(other))
        if "threadIdx" not in cond or not copies:
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
        if _has_shared_mark(node):
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
        jam = find_thread_tile(self, node, tile.outputs) if tile is not None else None
        held = self.held
        if jam is not None and held is not None and held.tile is None and may_hold(held, jam):
            held.tile = jam
            print_thread_tile(self, jam, depth, held=True)
        elif jam is not None:
            print_thread_tile(self, jam, depth)
        else:
            if held is not None and held.tile is None:
                held.iterators.append(loop.id)
            stages = self._ring(node, header)
            if stages > 1:
                self.pipelined_loop(node, loop, depth, marks, stages)
            else:
                super().for_(node, depth, marks, shared)
        self.divergent -= "threadIdx.x" in header

    def _ring(self, node: isl.AstNode, header: str) -> int:
        """The stages of the ring of buffers the loop `node` fills while it computes:
        those of its body's copy into shared memory (`marks.Shared`), where every
        thread of the block runs the loop alike; else 1 (no pipeline)."""
        mark = of_ast(node.for_get_body())
        if not isinstance(mark, Shared) or self.divergent or "threadIdx" in header:
            return 1
        return mark.stages

    def pipelined_loop(
        self, node: isl.AstNode, loop: Header, depth: int, marks: tuple[Mark, ...], stages: int
    ) -> None:
        """A loop whose body copies tiles into shared memory (a reduction's tile loop),
        pipelined over a ring of `stages` buffers: `tc_fill` issues the asynchronous
        copies (`cp.async`) of the tile of an iteration into a stage, and the loop
        fills the tile `stages - 1` iterations ahead while it computes its own. Each
        thread's copies of a tile are one commit group; an iteration waits until its
        tile's group has landed (all but the `stages - 2` newest), then one barrier makes
        it visible to the block and lets the stage filled next (the one the previous
        iteration read) be overwritten. A barrier after the loop ends the ring's use."""
        body = node.for_get_body()
        it, index = loop.iterator, self.dialect.index_type
        self.emit(depth, "{")
        rings = self._rings(self.ast.packed(body), depth + 1, stages)
        self._fill(rings, loop, depth + 1)
        self.emit(depth + 1, f"const {index} tc_first = {loop.init};")
        for k in range(stages - 1):
            self.emit(depth + 1, f"tc_fill(tc_first + {k} * ({loop.inc}), {k});")
            self.emit(depth + 1, "TC_CP_COMMIT();")
        self.emit(depth + 1, "int tc_stage = 0;")
        self.open_loop(depth + 1, loop.text)
        self.emit(depth + 2, f"TC_CP_WAIT({stages - 2});")
        self.emit(depth + 2, "__syncthreads();")
        ahead = f"{it} + {stages - 1} * ({loop.inc})"
        self.emit(depth + 2, f"tc_fill({ahead}, (tc_stage + {stages - 1}) % {stages});")
        self.emit(depth + 2, "TC_CP_COMMIT();")
        copies = {}
        for b, buffer, padded, stage in rings:
            offsets = self._offsets(depth + 2, buffer, b)
            copies[b.tensor] = LocalCopy(buffer, offsets, padded, base=f"tc_stage * {stage}")
        self._compute_from(copies, body.mark_get_node(), depth + 2, marks)
        self.emit(depth + 2, f"tc_stage = tc_stage == {stages - 1} ? 0 : tc_stage + 1;")
        self.emit(depth + 1, "}")
        self.emit(depth + 1, "TC_CP_WAIT(0);")
        self.emit(depth + 1, "__syncthreads();")
        self.emit(depth, "}")

    def _rings(
        self, boxes: tuple[PackedBox, ...], depth: int, stages: int
    ) -> list[tuple[PackedBox, str, tuple[int, ...], int]]:
        """Declares a ring of `stages` buffers in shared memory for each box; returns
        each box, its buffer, the extents of a stage's tile and a stage's elements."""
        assert self.kernel is not None
        rings = []
        for b in boxes:
            buffer = f"tc_shared{self.copies}"
            self.copies += 1
            scalar = self.scop.cdef.tensor(b.tensor).scalar
            itemsize = scalar.dtype.itemsize
            padded = (*b.sizes[:-1], _row_length(b.sizes[-1], self.kernel.runs, itemsize))
            stage = _stage_elements(math.prod(padded), itemsize)
            ctype = CUDA.ctype(scalar)
            self.emit(depth, f"__shared__ __align__(16) {ctype} {buffer}[{stages * stage}];")
            rings.append((b, buffer, padded, stage))
        return rings

    def _fill(
        self, rings: list[tuple[PackedBox, str, tuple[int, ...], int]], loop: Header, depth: int
    ) -> None:
        """`tc_fill(iterator, stage)`: the copies of the tiles of the loop's iteration
        `iterator` (none past the loop's end) into `stage` of each ring, by `cp.async`;
        the copies' offsets are the loop body's, evaluated at that iteration."""
        assert self.kernel is not None
        index = self.dialect.index_type
        self.emit(depth, f"auto tc_fill = [&](const {index} {loop.iterator}, const int tc_s) {{")
        self.emit(depth + 1, f"if (!({loop.cond})) return;")
        for b, buffer, padded, stage in rings:
            self.emit(depth + 1, "{")
            copy = LocalCopy(buffer, self._offsets(depth + 2, buffer, b), padded)
            self._async_copy(depth + 2, b, copy, max(1, self.kernel.threads), f"tc_s * {stage}")
            self.emit(depth + 1, "}")
        self.emit(depth, "};")

    def _compute_from(
        self, copies: dict[str, LocalCopy], inner: isl.AstNode, depth: int, marks: tuple[Mark, ...]
    ) -> None:
        """`inner` reading the tensors of `copies` from shared memory, under the guards
        sunk into the copy's scope (`if_`)."""
        saved, sunk = self.bodies, self.sunk
        self.bodies = dataclasses.replace(saved, copies={**saved.copies, **copies})
        self.sunk = []
        if sunk:
            self.emit(depth, f"if ({' && '.join(f'({c})' for c in sunk)}) {{")
        diverges = any("threadIdx.x" in c for c in sunk)  # the sunk guard splits the warp
        self.divergent += diverges
        self.node(inner, depth + bool(sunk), marks)
        self.divergent -= diverges
        if sunk:
            self.emit(depth, "}")
        self.bodies, self.sunk = saved, sunk

    def _async_copy(
        self, depth: int, b: PackedBox, copy: LocalCopy, threads: int, base: str
    ) -> None:
        """The copy of box `b` into `copy` from element `base` on, by `cp.async`, each
        thread taking every `threads`-th piece: 16 bytes at a time where (with
        `vectorize`) the box's and the buffer's rows are whole 16-byte pieces and, at
        run time, the rows start on one (as `_cooperative_copy` decides); else pairs of
        2-byte elements (4 bytes, the least a copy takes) where the rows allow them
        alike; else element by element, a `cp.async` of each element of 4 bytes or more,
        a load and a store of a 2-byte one."""
        itemsize = self.scop.cdef.tensor(b.tensor).scalar.dtype.itemsize
        widths = [16 // itemsize] if self.options.vectorize else []
        widths += [2] if itemsize == 2 else []
        last = len(b.sizes) - 1
        opened = 0
        for lanes in widths:
            if b.sizes[-1] % lanes or copy.sizes[-1] % lanes:
                continue
            aligned = (
                f"({copy.offsets[last]}) % {lanes} == 0 && "
                f"{extent_name(b.tensor, last)} % {lanes} == 0 && "
                f"((unsigned long long){tensor_name(b.tensor)} & {lanes * itemsize - 1}) == 0"
            )
            self.emit(depth + opened, f"if ({aligned}) {{")
            self._async_loop(depth + opened + 1, b, copy, threads, base, lanes)
            self.emit(depth + opened, "} else {")
            opened += 1
        self._async_loop(depth + opened, b, copy, threads, base, 1)
        for k in reversed(range(opened)):
            self.emit(depth + k, "}")

    def _async_loop(
        self, depth: int, b: PackedBox, copy: LocalCopy, threads: int, base: str, lanes: int
    ) -> None:
        """Each thread's pieces of `lanes` elements of the box (`_async_copy`)."""
        n = len(b.sizes)
        itemsize = self.scop.cdef.tensor(b.tensor).scalar.dtype.itemsize
        sizes = [*b.sizes[:-1], b.sizes[-1] // lanes]
        tid = "(int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z))"
        total = math.prod(sizes)
        self.open_loop(depth, f"for (int tc_e = {tid}; tc_e < {total}; tc_e += {threads}) {{")
        local: list[str] = []
        inside: list[str] = []
        rest = "tc_e"
        for d in reversed(range(n)):
            i = f"tc_i{d}"
            scaled = f" * {lanes}" if d == n - 1 and lanes > 1 else ""
            self.emit(depth + 1, f"const int {i} = {rest} % {sizes[d]}{scaled};")
            rest = f"{rest} / {sizes[d]}"
            local.insert(0, i)
            at = f"{copy.offsets[d]} + {i}"
            inside.insert(0, f"{at} >= 0 && {at} < {extent_name(b.tensor, d)}")
        target = f"{base} + {flat_index(self.dialect, local, [str(s) for s in copy.sizes])}"
        source = [f"{o} + {i}" for o, i in zip(copy.offsets, local, strict=True)]
        extents = [extent_name(b.tensor, d) for d in range(n)]
        index = flat_index(self.dialect, source, extents)
        array = tensor_name(b.tensor)
        self.emit(depth + 1, f"if ({' && '.join(inside)}) {{")
        if lanes * itemsize >= 4:
            statement = (
                f"TC_CP_ASYNC({copy.buffer}, {target}, {array}, {index}, {lanes * itemsize});"
            )
        else:
            statement = (
                f"TC_SST({copy.buffer}, {target}) = {CUDA.load.format(array=array, index=index)};"
            )
        self.emit(depth + 2, statement)
        self.emit(depth + 1, "}")
        self.emit(depth, "}")

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
            self.shared_copy(self.ast.packed(node), inner, depth, marks)
        elif isinstance(mark, Scratch):
            self.scratch(self.ast.packed(node), inner, depth, marks)
        elif isinstance(mark, Private):
            print_held_tile(self, inner, depth, marks)
        elif isinstance(mark, Rows):
            self.rows, saved = True, self.rows
            self.node(inner, depth, marks)
            self.rows = saved
        else:
            super().mark(mark, node, depth, marks)

    def scratch(
        self, boxes: tuple[PackedBox, ...], inner: isl.AstNode, depth: int, marks: tuple[Mark, ...]
    ) -> None:
        """A block's slices of temporaries that live and die in a row kernel
        (`tcpy.mapping.gpu.rows`), in shared memory: `inner` writes and reads them there
        instead of in global memory. Each warp touches only its rows' slices, so no
        barrier of the block is needed."""
        self.emit(depth, "{")
        places = {}
        for b in boxes:
            buffer = f"tc_scratch{self.copies}"
            self.copies += 1
            ctype = CUDA.ctype(self.scop.cdef.tensor(b.tensor).scalar)
            self.emit(depth + 1, f"__shared__ {ctype} {buffer}[{math.prod(b.sizes)}];")
            places[b.tensor] = LocalCopy(buffer, self._offsets(depth + 1, buffer, b), b.sizes)
        saved = self.bodies
        self.bodies = dataclasses.replace(saved, copies={**saved.copies, **places})
        self.node(inner, depth + 1, marks)
        self.bodies = saved
        self.emit(depth, "}")

    def _offsets(self, depth: int, buffer: str, b: PackedBox) -> tuple[str, ...]:
        """Declares the first element of box `b` of `buffer`; returns their names."""
        offsets = tuple(f"{buffer}_o{d}" for d in range(len(b.sizes)))
        for o, expr in zip(offsets, b.offsets, strict=True):
            value = isl_expr(expr, self.names, top=True)
            self.emit(depth, f"const {self.dialect.index_type} {o} = {value};")
        return offsets

    def shared_copy(
        self, boxes: tuple[PackedBox, ...], inner: isl.AstNode, depth: int, marks: tuple[Mark, ...]
    ) -> None:
        """The operand tiles of a block (`tcpy.mapping.gpu.shared.shared_tensors`) copied
        into shared memory by all its threads, then `inner` reading them there. A
        barrier before the copy lets the previous tile's readers finish, one after it
        makes the copy visible; every thread of the block reaches both, as the mark
        sits above the thread filter. Each thread copies every `threads`-th element,
        so consecutive threads read consecutive elements (coalesced); only the part of
        a box inside the tensor is copied (it holds every element read). Rows get the
        length of `_row_length`."""
        assert self.kernel is not None
        threads = max(1, self.kernel.threads)
        self.emit(depth, "{")
        self.emit(depth + 1, "__syncthreads();")
        copies = {}
        for b in boxes:
            buffer = f"tc_shared{self.copies}"
            self.copies += 1
            itemsize = self.scop.cdef.tensor(b.tensor).scalar.dtype.itemsize
            padded = (*b.sizes[:-1], _row_length(b.sizes[-1], self.kernel.runs, itemsize))
            ctype = CUDA.ctype(self.scop.cdef.tensor(b.tensor).scalar)
            self.emit(depth + 1, f"__shared__ __align__(16) {ctype} {buffer}[{math.prod(padded)}];")
            copy = LocalCopy(buffer, self._offsets(depth + 1, buffer, b), padded)
            self._cooperative_copy(depth + 1, b, copy, threads)
            copies[b.tensor] = copy
        self.emit(depth + 1, "__syncthreads();")
        self._compute_from(copies, inner, depth + 1, marks)
        self.emit(depth, "}")

    def _cooperative_copy(self, depth: int, b: PackedBox, copy: LocalCopy, threads: int) -> None:
        """The copy of box `b` into `copy`, each thread taking every `threads`-th
        element. With `vectorize`, where the box's rows are a whole number of 16-byte
        vectors, it reads them as vectors (`float4`, `int4`) when, at run time, the
        rows start on a vector (the box's offset, the tensor's row length and its
        address all allow it: the same for the whole block), else one element at a
        time."""
        vector = _VECTOR_TYPES.get(self.scop.cdef.tensor(b.tensor).scalar)
        if not self.options.vectorize or vector is None or b.sizes[-1] % VECTOR_LANES:
            self._copy_loop(depth, b, copy, threads, None)
            return
        last = len(b.sizes) - 1
        aligned = (
            f"({copy.offsets[last]}) % {VECTOR_LANES} == 0 && "
            f"{extent_name(b.tensor, last)} % {VECTOR_LANES} == 0 && "
            f"((unsigned long long){tensor_name(b.tensor)} & 15) == 0"
        )
        self.emit(depth, f"if ({aligned}) {{")
        self._copy_loop(depth + 1, b, copy, threads, vector)
        self.emit(depth, "} else {")
        self._copy_loop(depth + 1, b, copy, threads, None)
        self.emit(depth, "}")

    def _copy_loop(
        self, depth: int, b: PackedBox, copy: LocalCopy, threads: int, vector: str | None
    ) -> None:
        """Each thread loads `COPY_BATCH` elements (or vectors) of the box, a block's
        threads apart, into registers, then stores them: that many loads in flight
        (one with `unroll_copy_shared=False`)."""
        lanes = VECTOR_LANES if vector else 1
        sizes = [*b.sizes[:-1], b.sizes[-1] // lanes]  # in vectors along the last
        total = math.prod(sizes)
        wanted = COPY_BATCH if self.options.unroll_copy_shared else 1
        batch = max(1, min(wanted, -(-total // threads)))
        tid = "(int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z))"
        step = threads * batch
        self.open_loop(depth, f"for (int tc_e0 = {tid}; tc_e0 < {total}; tc_e0 += {step}) {{")
        ctype = vector or CUDA.ctype(self.scop.cdef.tensor(b.tensor).scalar)
        self.emit(depth + 1, f"{ctype} tc_v[{batch}];")
        for storing in (False, True):
            self.emit(depth + 1, "#pragma unroll")
            self.emit(depth + 1, f"for (int tc_u = 0; tc_u < {batch}; tc_u++) {{")
            self._copy_element(depth + 2, b, copy, sizes, threads, vector, storing)
            self.emit(depth + 1, "}")
        self.emit(depth, "}")

    def _copy_element(
        self,
        depth: int,
        b: PackedBox,
        copy: LocalCopy,
        sizes: list[int],
        threads: int,
        vector: str | None,
        storing: bool,
    ) -> None:
        """Element `tc_e0 + tc_u * threads` of a copy: its load into `tc_v[tc_u]`, or
        (`storing`) its store from there into the shared buffer."""
        n = len(b.sizes)
        lanes = VECTOR_LANES if vector else 1
        self.emit(depth, f"const int tc_e = tc_e0 + tc_u * {threads};")
        local: list[str] = []
        inside = [f"tc_e < {math.prod(sizes)}"]
        rest = "tc_e"
        for d in reversed(range(n)):
            i = f"tc_i{d}"
            scaled = f" * {lanes}" if d == n - 1 and lanes > 1 else ""
            self.emit(depth, f"const int {i} = {rest} % {sizes[d]}{scaled};")
            rest = f"{rest} / {sizes[d]}"
            local.insert(0, i)
            at = f"{copy.offsets[d]} + {i}"
            inside.insert(1, f"{at} >= 0 && {at} < {extent_name(b.tensor, d)}")
        target = flat_index(self.dialect, local, [str(s) for s in copy.sizes])
        self.emit(depth, f"if ({' && '.join(inside)}) {{")
        if not storing:
            source = [f"{o} + {i}" for o, i in zip(copy.offsets, local, strict=True)]
            extents = [extent_name(b.tensor, d) for d in range(n)]
            index = flat_index(self.dialect, source, extents)
            load = (
                CUDA.load.format(array=tensor_name(b.tensor), index=index)
                if vector is None
                else f"TC_LDV({vector}, {tensor_name(b.tensor)}, {index})"
            )
            self.emit(depth + 1, f"tc_v[tc_u] = {load};")
        elif vector is None:
            self.emit(depth + 1, f"TC_SST({copy.buffer}, {target}) = tc_v[tc_u];")
        else:
            # a vector lies inside the tensor or outside it whole: it starts on a
            # multiple of the lanes, as the tensor's rows end on one. Its elements are
            # stored in an order rotated by the lane and the word it starts at, so
            # that each of the four stores of a warp hits 32 distinct banks (stored
            # in order, lanes four words apart would share them)
            self.emit(depth + 1, f"const {vector} tc_x = tc_v[tc_u];")
            self.emit(depth + 1, f"const int tc_w = {target};")
            self.emit(depth + 1, "const int tc_r = (tc_e >> 3) - tc_w;")
            pick = "tc_c == 0 ? tc_x.x : tc_c == 1 ? tc_x.y : tc_c == 2 ? tc_x.z : tc_x.w"
            for k in range(lanes):
                self.emit(depth + 1, f"{{ const int tc_c = ({k} + tc_r) & 3;")
                self.emit(depth + 2, f"TC_SST({copy.buffer}, tc_w + tc_c) = {pick}; }}")
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


def _row_length(elements: int, runs: int, itemsize: int = 4) -> int:
    """The length of a row of a tile of `elements` in shared memory: one word more for
    rows of 32 elements or more (one element; two of 2 bytes, which keeps rows on 4
    bytes), so that threads walking a column of the tile hit distinct banks; where
    threads read runs of adjacent elements (`MappedKernel.runs`), which the mapping
    gives only where no thread walks a column, a multiple of 4 instead, so that every
    run starts on a vector."""
    if runs > 1:
        return -(-elements // VECTOR_LANES) * VECTOR_LANES
    return elements + (elements >= WARP) * max(1, 4 // itemsize)


VECTOR_LANES = 4
COPY_BATCH = 4
"""The elements (or vectors) each thread of a cooperative copy loads before storing
them (`unroll_copy_shared`). One at a time, each load waits for the store of the one
before, which waits for its load: a single load in flight per thread."""
_VECTOR_TYPES = {ScalarType.FLOAT32: "float4", ScalarType.INT32: "int4"}
"""The 16-byte vectors a shared-memory copy reads, by the tensor's element type."""


def _stage_elements(elements: int, itemsize: int) -> int:
    """The elements of a stage of a ring of buffers holding `elements`: a whole number
    of 16-byte pieces, so that every stage starts on one."""
    per = 16 // itemsize if itemsize <= 16 else 1
    return -(-elements // per) * per


def kernel_name(kernel: MappedKernel) -> str:
    return f"tc_kernel_{kernel.index}"


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
    kernels: list[str] = []
    helpers: Helpers | None = None
    counted = 0
    for kernel, ast in zip(mapping.kernels, asts, strict=True):
        printer = CudaPrinter(scop, ast, options, dialect=dialect, count_loops=count_loops)
        printer.counted = counted
        kernels.append(_kernel(printer, kernel, helpers, narrow))
        helpers, counted = printer.helpers, printer.counted
    header = [
        f"/* {cdef.name}: generated by tcpy for CUDA from */",
        *(f"/*   {line.replace('*/', '* /')} */" for line in def_text(cdef).splitlines()),
        "",
        ACCESS_MACROS,
        *([halves.CUDA_HALF_TYPES] if halves.half_types(cdef) else []),
        *([instructions.CUDA_INSTRUCTIONS] if instructions.needed("".join(kernels)) else []),
        *([loop_count_declarations(counted, cxx=True)] if count_loops else []),
        helper_source(helpers, dialect) if helpers is not None else "",
    ]
    return "\n".join([*header, *kernels, ""])


def _kernel(
    printer: CudaPrinter, kernel: MappedKernel, helpers: Helpers | None, narrow: bool
) -> str:
    """One `__global__` function: `kernel`'s code, printed by `printer` (sharing the
    `helpers` of the kernels before it), its indices `narrow` or not."""
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
    for name in buffer_order(cdef):
        for d, extent in enumerate(cdef.tensor(name).shape):
            printer.emit(
                1, f"const {dialect.index_type} {extent_name(name, d)} = {sym_expr(extent)};"
            )
    printer.top_level(1)
    bounds = max(1, kernel.threads)
    signature = ", ".join(kernel_parameters(scop, narrow))
    launch = f'extern "C" __global__ void __launch_bounds__({bounds}) '
    return "\n".join([f"{launch}{kernel_name(kernel)}({signature}) {{", *body, "}"])


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
    text = def_text(cdef)  # the def as written: its numbers, and the digits in its names
    literals = [int(n) for n in "".join(c if c.isdigit() else " " for c in text).split()]
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
