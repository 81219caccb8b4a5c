"""isl AST -> C with OpenMP: one method per AST node kind.

The kernel is `int tc_kernel(const int64_t *sizes, void *const *buffers, int threads)`:
sizes in the order of the definition's size symbols, buffers in the order inputs,
outputs, temporaries, and the number of OpenMP threads to run on (chosen at each call,
so no kernel is built for a thread count); it returns 0, or a status code when the data
made the computation undefined (an integer division by zero, an index out of range).

Marks in the schedule tree become pragmas on the loop the marked band generates (the
mark `omp_parallel@3` belongs to the loop of schedule depth 3, which isl names `c3`,
and to no loop if isl dropped that loop as a single iteration):
`omp_parallel` -> `#pragma omp for`, `omp_simd` -> `#pragma omp simd`; the
innermost loops get `#pragma GCC unroll` when the options ask for unrolling. A loop
that only reduces into one element keeps its accumulator in a local (register
promotion) under `#pragma omp simd reduction`, which reassociates the reduction as TC
allows. Under a `register_tile:RxV` mark (`tcpy.mapping.cpu.registers`) the block of
outputs lives in a local array `tc_reg[R][V]` across the reduction loops
(`tcpy.codegen.register_block`); under a `jam:R` mark, a vector loop of outputs each
reduced in a register over R steps of a reduction (`tcpy.codegen.jam`). The TC
statements computed by each top-level loop nest are printed as comments above it.

A kernel with parallel loops runs its nests in one `#pragma omp parallel` region
(`tcpy.codegen.region`): threads are started once per call, not once per nest, and wait
for each other only where a nest needs what an earlier one wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from tcpy.codegen import halves
from tcpy.codegen import vector_math as own_math
from tcpy.codegen.ast_build import Ast
from tcpy.codegen.c_helpers import helper_source, vector_math_declarations
from tcpy.codegen.isl_exprs import sym_expr
from tcpy.codegen.jam import print_jam
from tcpy.codegen.loops import loop_count_declarations
from tcpy.codegen.pack import ALIGN, ARENA, MINE, SHARED, arena_bytes, print_pack, shared_starts
from tcpy.codegen.printer import Printer, buffer_order, def_text
from tcpy.codegen.region import BARRIER_C, has_parallel_loop, print_region
from tcpy.codegen.register_block import UnprintedBlock, print_register_block
from tcpy.codegen.status import STATUS_OUT_OF_MEMORY
from tcpy.mapping.marks import Jam, Mark, Pack, Parallel, RegisterBlock, Scratch, Simd
from tcpy.mapping.options import MappingOptions
from tcpy.naming import extent_name, size_name, tensor_name
from tcpy.parser import ast as tc
from tcpy.parser.checked import CheckedDef, Role
from tcpy.poly.scop import Scop
from tcpy.types import promote

KERNEL_SYMBOL = "tc_kernel"
CONSERVATIVE_MACRO = "TC_CONSERVATIVE"  # defined by a build that retries with safe flags


@dataclass
class CPrinter(Printer):
    """C with OpenMP: loop marks become pragmas, `pack:` marks copies into a thread's
    buffers, `register_tile:` marks blocks of outputs in registers; invariant reads
    are hoisted out of innermost loops so that fused nests vectorise."""

    hoists = True

    def mark(self, mark: Mark, node: isl.AstNode, depth: int, marks: tuple[Mark, ...]) -> None:
        inner = node.mark_get_node()
        boxes = self.ast.packed(node)
        if boxes:
            once = isinstance(mark, Pack) and mark.once
            key = node.get_annotation().get_name() if once else None
            print_pack(self, boxes, inner, depth, marks, not isinstance(mark, Scratch), key)
        elif isinstance(mark, RegisterBlock):
            sizes = list(mark.sizes)
            if print_register_block(self, inner, depth, marks, sizes, mark.across, mark.fresh):
                return
            if mark.fresh:
                raise UnprintedBlock(f"register block {mark.name} has no block's shape")
            super().mark(mark, node, depth, marks)
        elif not isinstance(mark, Jam) or not print_jam(self, inner, depth, marks, mark.size):
            super().mark(mark, node, depth, marks)

    def pragmas(
        self, marks: tuple[Mark, ...], innermost: bool, unroll: int, shared: str | None = None
    ) -> list[str]:
        """A loop's pragmas: `omp for` with the clauses `shared` for the worksharing
        loop of the kernel's parallel region; a parallel loop met anywhere else (never,
        as mapped) opens a region of its own, which OpenMP runs on one thread when it is
        nested."""
        out = []
        parallel = any(isinstance(m, Parallel) for m in marks)
        simd = any(isinstance(m, Simd) for m in marks)
        work = f"for{' simd' if simd else ''}"
        if parallel and shared is not None:
            out.append(f"#pragma omp {work}{shared}")
        elif parallel:
            out.append(f"#pragma omp parallel {work}")
        elif simd:
            out.append("#pragma omp simd")
        if innermost and unroll > 1 and not out:  # OpenMP loops take no other pragma
            out.append(f"#pragma GCC unroll {unroll}")
        return out

    def reduction_pragmas(self, clause: str) -> list[str]:
        """Pragmas of a loop whose accumulator lives in a register (vectorised as a
        reduction when the options allow vectorising)."""
        if not self.options.vectorize:
            return []
        return [f"#pragma omp simd reduction({clause}:tc_acc)"]


EXACT_ARITHMETIC = """#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif"""
"""Each operation rounded on its own, as the reference computes: no fused multiply-add
contracted from `a * b + c`. Printed for a def that compares floats for equality (the
ties of a `max` or `min` backward), whose comparisons must see the values the same
expression gives wherever the def computes it."""


def compares_floats(cdef: CheckedDef) -> bool:
    """Whether a statement of `cdef` compares floats with `==` or `!=`."""
    return any(
        isinstance(n, tc.Binary)
        and n.op in (tc.BinaryOp.EQ, tc.BinaryOp.NE)
        and n.lhs.ty is not None
        and n.rhs.ty is not None
        and promote(n.lhs.ty, n.rhs.ty).is_float
        for st in cdef.statements
        for e in st.expressions
        for n in tc.walk(e)
    )


def print_c(
    scop: Scop,
    ast: Ast,
    options: MappingOptions,
    sizes: Mapping[str, int] | None,
    vector_math: bool = False,
    vector_bytes: int = 16,
    count_loops: bool = False,
) -> str:
    """The C translation unit of a kernel; with `sizes`, the sizes are constants; with
    `vector_math`, the math functions libmvec vectorises are declared `simd` (and
    those it computes faster than tcpy's own are left to it, `vector_math.chosen`);
    `vector_bytes` is the width of the vectors the compiler uses; `count_loops`: a
    counting build (`tcpy.codegen.loops.COUNT_LOOP`)."""
    printer = CPrinter(scop, ast, options, count_loops=count_loops)
    printer.vector_bytes = vector_bytes
    printer.helpers.own = own_math.chosen(libmvec=vector_math)
    cdef = scop.cdef
    body: list[str] = []
    printer.lines = body
    _prologue(printer, sizes)
    region = any(has_parallel_loop(printer, nest, ()) for nest in printer.nests())
    arena = arena_bytes(ast, cdef)
    printer.shared_starts = shared_starts(ast, cdef)
    _body(printer, region, arena, printer.shared_starts[""])
    half_types = halves.half_types(cdef)
    header = [
        f"/* {cdef.name}: generated by tcpy from */",
        *(f"/*   {line.replace('*/', '* /')} */" for line in def_text(cdef).splitlines()),
        "#include <stdint.h>",
        "#include <stdbool.h>",
        "#include <math.h>",
        *(["#include <stdlib.h>"] if arena or printer.shared_starts[""] else []),
        *(["int omp_get_thread_num(void);"] if arena and region else []),
        *([BARRIER_C] if region else []),
        _guarded(vector_math_declarations(printer.helpers.builtins)) if vector_math else "",
        *([EXACT_ARITHMETIC] if compares_floats(cdef) else []),
        *([loop_count_declarations(printer.counted)] if count_loops else []),
        "",
        helper_source(printer.helpers),
        *([halves.c_helpers(half_types)] if half_types else []),
        "",
        f"int {KERNEL_SYMBOL}(const int64_t *restrict tc_sizes,",
        "              void *const *restrict tc_buffers, int tc_threads) {",
    ]
    unused = [] if region else ["(void)tc_threads;"]
    if sizes is not None or not scop.params:
        unused.append("(void)tc_sizes;")
    return "\n".join([*header, *(f"  {u}" for u in unused), *body, "}", ""])


def _prologue(printer: CPrinter, sizes: Mapping[str, int] | None) -> None:
    """The kernel's sizes (constants with `sizes`), its tensors' pointers and extents,
    and its status word."""
    scop = printer.scop
    for k, p in enumerate(scop.params):
        value = str(sizes[p]) if sizes is not None else f"tc_sizes[{k}]"
        printer.emit(1, f"const int64_t {size_name(p)} = {value};")
    for k, name in enumerate(buffer_order(scop.cdef)):
        info = scop.cdef.tensor(name)
        ctype = printer.dialect.ctype(info.scalar)
        const = "const " if info.role is Role.INPUT else ""
        printer.emit(
            1, f"{const}{ctype} *restrict {tensor_name(name)} = ({const}{ctype} *)tc_buffers[{k}];"
        )
        for d, extent in enumerate(info.shape):
            printer.emit(1, f"const int64_t {extent_name(name, d)} = {sym_expr(extent)};")
    printer.emit(1, "int tc_status_value = 0;")
    printer.emit(1, "int *tc_status = &tc_status_value;")


def _body(printer: CPrinter, region: bool, arena: int, shared: int) -> None:
    """The kernel's nests, in one parallel `region` or not, with the `arena` of
    bytes each thread's packed tiles take and the `shared` bytes of the copies made
    once (after every thread's part), allocated first, freed last."""
    if arena or shared:
        # before any work: a thread without its buffers could not keep to the barriers
        threads = "(size_t)tc_threads" if region else "1"
        total = " + ".join([f"{threads} * {arena}"] * bool(arena) + [str(shared)] * bool(shared))
        printer.emit(1, f"char *{ARENA} = (char *)aligned_alloc({ALIGN}, {total});")
        printer.emit(1, f"if (!{ARENA}) return {STATUS_OUT_OF_MEMORY};")
    if shared:
        after = f" + {threads} * {arena}" if arena else ""
        printer.emit(1, f"char *{SHARED} = {ARENA}{after};")
    if region:
        mine = f"(size_t)omp_get_thread_num() * {arena}"
        print_region(printer, 1, (f"char *{MINE} = {ARENA} + {mine};",) if arena else ())
    else:
        if arena:
            printer.emit(1, f"char *{MINE} = {ARENA};")
        printer.top_level(1)
    if arena or shared:
        printer.emit(1, f"free({ARENA});")
    printer.emit(1, "return tc_status_value;")


def _guarded(declarations: str) -> str:
    """Vector math declarations, left out of a conservative build (a compiler once
    crashed on a `simd` clone of powf)."""
    if not declarations:
        return ""
    return f"#ifndef {CONSERVATIVE_MACRO}\n{declarations}\n#endif"
