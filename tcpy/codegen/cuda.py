"""isl ASTs of mapped kernels -> one self-contained CUDA translation unit.

Each kernel of a `GpuMapping` becomes `extern "C" __global__ void tc_kernel_<k>`, with
`__launch_bounds__` set to the threads the mapping uses. Its parameters are, in order:
the sizes (`long long`), the buffers (inputs `const`, then outputs and temporaries),
and `int *tc_status`. The block and thread parameters of the mapping are spelled
`blockIdx.x`, `threadIdx.x`, ...; innermost loops get `#pragma unroll` when the
options ask for it; a loop that only reduces into one element keeps its accumulator in
a register; tensors that are only read go through `__ldg` with `use_readonly_cache`.
Every global access is written through the access macros (`ACCESS_MACROS`: plain
indexing, which the emulator's instrumented build replaces with checking and counting
hooks). No includes: types are C++'s own and every math function is CUDA's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from tcpy.codegen.ast_build import Ast
from tcpy.codegen.c import _def_text, _Printer, buffer_order
from tcpy.codegen.c_helpers import helper_source
from tcpy.codegen.dialect import CUDA
from tcpy.codegen.exprs import BodyPrinter, StatementParts, sym_expr
from tcpy.codegen.loops import FOR, IF
from tcpy.codegen.naming import BLOCK_PARAMS, THREAD_PARAMS, extent_name, size_name, tensor_name
from tcpy.errors import InternalError, TCMappingError
from tcpy.mapping.device import WARP
from tcpy.mapping.gpu import LANES_MARK, GpuMapping, Kernel
from tcpy.mapping.options import MappingOptions
from tcpy.parser.checked import Role
from tcpy.poly.isl_helpers import ast_children
from tcpy.poly.scop import Scop
from tcpy.types import ScalarType

_AXES = ("x", "y", "z")

# Global and shared accesses go through these macros: plain indexing here (NVRTC); the
# emulator's header defines hooks in their place for its checking and counting build.
# TC_LD/TC_ST: a global load/store (TC_ST is an lvalue), TC_LDG through the read-only
# cache, TC_LDV a vector load (`TC_LDV(float4, a, i)`), TC_AT the address of an atomic;
# TC_SLD/TC_SST/TC_SAT the same on a shared array; TC_DYNAMIC_SHARED declares the
# dynamic shared memory.
ACCESS_MACROS = r"""#ifndef TC_ACCESS_MACROS
#define TC_ACCESS_MACROS
#define TC_LD(a, i) ((a)[i])
#define TC_LDG(a, i) __ldg(&(a)[i])
#define TC_ST(a, i) ((a)[i])
#define TC_AT(a, i) (&(a)[i])
#define TC_LDV(T, a, i) (*reinterpret_cast<const T *>(&(a)[i]))
#define TC_SLD(s, i) ((s)[i])
#define TC_SST(s, i) ((s)[i])
#define TC_SAT(s, i) (&(s)[i])
#endif
#ifndef TC_DYNAMIC_SHARED
#define TC_DYNAMIC_SHARED(T, s) extern __shared__ __align__(16) T s[]
#endif
"""


@dataclass
class _CudaPrinter(_Printer):
    hoists = False
    lane_parts: StatementParts | None = None  # inside a lane reduction: what it reduces

    def node(self, node: isl.AstNode, depth: int, marks: tuple[str, ...] = ()) -> None:
        is_mark = node.get_type() == isl.ast_node_type.mark
        if is_mark and node.mark_get_id().get_name() == LANES_MARK:
            self.lane_reduction(node.mark_get_node(), depth, marks)
        else:
            super().node(node, depth, marks)

    def lane_reduction(self, inner: isl.AstNode, depth: int, marks: tuple[str, ...]) -> None:
        """A reduction spread over the lanes of a warp (`tcpy.mapping.gpu`): each lane
        reduces its instances into a register, from the identity; the warp combines
        the lanes' partial results by a butterfly of shuffles, outside every loop and
        guard of the subtree, where all 32 lanes arrive; lane 0 combines the total into
        the element, when some lane had an instance (a guard may leave a whole row
        out). Every instance under the mark reduces into one element, which the
        mapping guarantees and this checks."""
        users, iterators = _users_and_iterators(inner)
        found = [self.reduction_at(u) for u in users]
        first = found[0] if found else None
        if first is None or any(f is None or f != first for f in found):
            raise InternalError("a lane reduction must run instances of one reduction")
        source, values = first
        if any(re.search(rf"\b{i}\b", values[v]) for v in source.indices for i in iterators):
            raise InternalError("a lane reduction must reduce into one element")
        parts = self.bodies.parts(source, values)
        self.emit(depth, "{")
        self.emit(depth + 1, f"{parts.compute} tc_part = {parts.identity};")
        self.emit(depth + 1, "bool tc_seen = false;")
        self.lane_parts = parts
        self.node(inner, depth + 1, marks)
        self.lane_parts = None
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
        if self.lane_parts is None:
            super().user(node, depth)
            return
        found = self.reduction_at(node)
        assert found is not None
        parts = self.bodies.parts(*found)
        self.emit(depth, f"tc_part = {parts.combine('tc_part')};")
        self.emit(depth, "tc_seen = true;")

    def accumulator(self, body: isl.AstNode, iterator: str) -> StatementParts | None:
        return None if self.lane_parts is not None else super().accumulator(body, iterator)

    def pragmas(
        self, marks: tuple[str, ...], innermost: bool, unroll: int, shared: str | None = None
    ) -> list[str]:
        if innermost and unroll > 1:
            return [f"#pragma unroll {unroll}"]
        return []

    def reduction_pragmas(self, clause: str) -> list[str]:
        return []


def kernel_name(kernel: Kernel) -> str:
    return f"tc_kernel_{kernel.index}"


def kernel_parameters(scop: Scop) -> list[str]:
    """The C parameter list shared by every kernel of a definition."""
    cdef = scop.cdef
    params = [f"long long {size_name(p)}" for p in scop.params]
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
) -> str:
    cdef = scop.cdef
    for t in cdef.tensors:
        if t.scalar is ScalarType.FLOAT16:
            raise TCMappingError(
                f"{t.name} is float16, which the CUDA target does not support yet; "
                "use float32 or the cpu target"
            )
    readonly = frozenset(t.name for t in cdef.inputs) if options.use_readonly_cache else frozenset()
    kernels: list[str] = []
    helpers = None
    for kernel, ast in zip(mapping.kernels, asts, strict=True):
        printer = _CudaPrinter(scop, ast, options, dialect=CUDA)
        if helpers is not None:
            printer.helpers = helpers
        printer.bodies = BodyPrinter(cdef, CUDA, printer.helpers, readonly)
        helpers = printer.helpers
        printer.names.update(_launch_names(kernel))
        body: list[str] = []
        printer.lines = body
        for name in buffer_order(scop.cdef):
            for d, extent in enumerate(cdef.tensor(name).shape):
                printer.emit(1, f"const long long {extent_name(name, d)} = {sym_expr(extent)};")
        printer.top_level(1)
        bounds = max(1, kernel.threads)
        signature = ", ".join(kernel_parameters(scop))
        kernels.append(
            "\n".join(
                [
                    f'extern "C" __global__ void __launch_bounds__({bounds}) '
                    f"{kernel_name(kernel)}({signature}) {{",
                    *body,
                    "}",
                ]
            )
        )
    header = [
        f"/* {cdef.name}: generated by tcpy for CUDA from */",
        *(f"/*   {line.replace('*/', '* /')} */" for line in _def_text(cdef).splitlines()),
        "",
        ACCESS_MACROS,
        helper_source(helpers, CUDA) if helpers is not None else "",
    ]
    return "\n".join([*header, *kernels, ""])


def _launch_names(kernel: Kernel) -> dict[str, str]:
    names = {p: f"(long long){kernel.block_index(j)}" for j, p in enumerate(BLOCK_PARAMS)
             if j < len(kernel.grid)}  # fmt: skip
    names.update(
        {p: f"(long long)threadIdx.{a}" for p, a in zip(THREAD_PARAMS, _AXES, strict=True)}
    )
    return names


def _users_and_iterators(node: isl.AstNode) -> tuple[list[isl.AstNode], list[str]]:
    """The user nodes under `node`, and the iterators of the loops under it."""
    users: list[isl.AstNode] = []
    iterators: list[str] = []
    stack = [node]
    while stack:
        n = stack.pop()
        kind = n.get_type()
        if kind == isl.ast_node_type.user:
            users.append(n)
        elif kind == FOR:
            iterators.append(n.for_get_iterator().get_id().get_name())
            stack.append(n.for_get_body())
        elif kind == IF:
            stack.append(n.if_get_then_node())
            if n.if_has_else_node():
                stack.append(n.if_get_else_node())
        elif kind == isl.ast_node_type.mark:
            stack.append(n.mark_get_node())
        else:
            stack.extend(ast_children(n))
    return users, iterators
