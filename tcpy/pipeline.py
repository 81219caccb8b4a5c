"""The compiler, stage by stage, in one screen.

    checked def ──scop──> ──dependences──> ──schedule──> ──mapping──> ──isl AST──> ──C──

Each stage is a function of the previous stage's result and the options; with
verification on (tests, `TCPY_VERIFY=1`) the schedule is checked against every
dependence after each pass that changes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import islpy as isl

from tcpy import knobs, log
from tcpy.codegen import one_kernel
from tcpy.codegen.ast_build import Ast, build_ast
from tcpy.codegen.c import compares_floats, print_c
from tcpy.codegen.cuda import (
    OneKernelRefused,
    RowsOutOfStep,
    SharedCopyInDivergentLoop,
    one_kernel_threads,
    print_cuda,
)
from tcpy.codegen.register_block import UnprintedBlock
from tcpy.mapping.cpu import fresh_blocks, map_to_cpu
from tcpy.mapping.cpu.packing import without_scratch
from tcpy.mapping.gpu import GpuMapping, map_to_gpu
from tcpy.mapping.gpu.device import DeviceProfile
from tcpy.mapping.gpu.kernel import Launch
from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.parser.checked import CheckedDef
from tcpy.poly.analysis import Analysis, analyse
from tcpy.poly.dependences import Dependences
from tcpy.poly.hoist import hoist_invariant_factors
from tcpy.poly.isl_helpers import isl_errors
from tcpy.poly.online import online_reductions
from tcpy.poly.scop import Scop
from tcpy.poly.slices import sliced_operands
from tcpy.poly.transforms import verify
from tcpy.poly.widen import widen_half_reductions
from tcpy.runtime import cpu as runtime


@dataclass(frozen=True, eq=False, slots=True)
class Lowered:
    """Everything one compilation produced, for inspection (`tcpy compile --emit`)."""

    cdef: CheckedDef
    options: MappingOptions  # what ran: the given options, changed by any fallback
    scop: Scop
    dependences: Dependences
    schedule: isl.Schedule  # after mapping
    ast: Ast
    source: str
    fallbacks: tuple[str, ...] = ()  # what a fallback gave up, in words
    clock_forced: bool = False  # a fallback came from a wall-clock stop: do not cache


SOURCE_LIMIT = 1 << 18
"""Bytes of generated code past which a kernel is lowered again with plain options
(`plain`): a fused, skewed, tiled schedule at sizes known only at run time can make
isl's AST split into hundreds of cases, and gcc then takes minutes (500 KB of C, 1,464
loops: over 5 minutes at -O3, a pair the fuzzer stopped)."""


def plain(options: MappingOptions) -> MappingOptions:
    """`options` without what multiplies the code a schedule prints: fusion, skewing,
    tiles, register blocks and unrolling."""
    return dataclasses.replace(
        options,
        outer_schedule_fusion=Fusion.MIN,
        intra_tile_schedule_fusion=Fusion.MIN,
        allow_skewing=False,
        tile=(0,),
        register_tile=(0,),
        unroll=1,
    )


def cuda_plain(options: MappingOptions) -> MappingOptions:
    """`plain`, the GPU mapping's own tiles kept: a CUDA kernel's tiles make its grid
    and its blocks, not more code (untiled, every output ran in a block of one thread:
    a bfloat16 BERT layer past `SOURCE_LIMIT` ran 12x slower)."""
    return plain(options).replace(tile=())


def lower_to_c(
    cdef: CheckedDef,
    sizes: Mapping[str, int],
    options: MappingOptions,
    check: bool | None = None,
    count_loops: bool = False,
) -> Lowered:
    """`count_loops`: print a counting build (a counter per loop, `Compiled.iterations`).
    A source past `SOURCE_LIMIT` is lowered again with `plain` options."""
    cdef = hoist_invariant_factors(widen_half_reductions(cdef, extrema=False))
    cdef = online_reductions(cdef, options.online_tile)
    return _within_limit(lambda o: _lower_to_c(cdef, sizes, o, check, count_loops), options)


def _lower_to_c(
    cdef: CheckedDef,
    sizes: Mapping[str, int],
    options: MappingOptions,
    check: bool | None,
    count_loops: bool,
) -> Lowered:
    check = knobs.verify_schedules() if check is None else check
    # 1-3. Scop, dependences and isl's schedule, in bounded time (fallbacks on failure).
    analysis = _analyse(cdef, sizes, options, check)
    scop, deps, options = analysis.scop, analysis.deps, analysis.options
    fixed = sizes if options.fix_parameters_before_scheduling else None
    # 4. CPU mapping: tiles, unit-stride interchange, OpenMP parallel and simd marks.
    scop.ctx.reset_operations()  # a stage of its own: its own budget of isl operations
    with log.stage("map"), isl_errors(f"mapping {cdef.name} to the CPU"):
        schedule = map_to_cpu(
            analysis.schedule, scop, deps, options, vector_bytes=runtime.vector_bytes()
        )
        _verify(check, schedule, scop, deps)
    # register blocks that start at the identity, their initialisations left out
    # (after the check, which expects every instance)
    scop.ctx.reset_operations()
    try:
        schedule, ast, source = _printed(
            scop, fresh_blocks(schedule, scop), options, fixed, count_loops
        )
    except UnprintedBlock:
        schedule, ast, source = _printed(scop, schedule, options, fixed, count_loops)
    return Lowered(
        cdef, options, scop, deps, schedule, ast, source,
        analysis.fallbacks, analysis.clock_forced,
    )  # fmt: skip


def _printed(
    scop: Scop,
    schedule: isl.Schedule,
    options: MappingOptions,
    fixed: Mapping[str, int] | None,
    count_loops: bool,
) -> tuple[isl.Schedule, Ast, str]:
    """Steps 5 and 6 of `lower_to_c`: the schedule (without scratch marks where isl
    split a row), its AST and the C."""
    # 5. isl's AST generator turns the schedule tree into loops.
    with log.stage("ast"):
        ast = build_ast(scop, schedule)
        # isl split a row's statements into pieces: one piece, else no buffer shared
        if ast.split_scratch:
            ast = build_ast(scop, schedule, grouped=True)
        if ast.split_scratch:
            schedule = without_scratch(schedule)
            ast = build_ast(scop, schedule)
    # 6. The C printer writes statement bodies, pragmas and the kernel's prologue.
    with log.stage("print"):
        source = print_c(
            scop, ast, options, fixed,
            vector_math=runtime.vector_math(), vector_bytes=runtime.vector_bytes(),
            count_loops=count_loops,
        )  # fmt: skip
    return schedule, ast, source


@dataclass(frozen=True, eq=False, slots=True)
class LoweredCuda:
    cdef: CheckedDef
    options: MappingOptions  # what ran: the given options, changed by any fallback
    scop: Scop
    mapping: GpuMapping
    asts: tuple[Ast, ...]
    source: str
    fallbacks: tuple[str, ...] = ()
    clock_forced: bool = False
    # compiled without contracting `a * b + c` into a fused multiply-add: the def
    # compares floats for equality (`codegen.c.compares_floats`), as the C target does
    exact: bool = False

    @property
    def one_kernel(self) -> bool:
        """Whether the kernels were printed as one (`MappingOptions.one_kernel`)."""
        return one_kernel_threads(self.mapping, self.options) > 0

    @property
    def launches(self) -> list[Launch]:
        """The grid and block of each launch, in order: each kernel's, or the one
        kernel's (`tcpy.codegen.one_kernel.launch`) on a block for each block of its
        largest part."""
        threads = one_kernel_threads(self.mapping, self.options)
        if threads:
            return [one_kernel.launch(self.mapping.kernels, threads)]
        return [k.launch_dims() for k in self.mapping.kernels]


def lower_to_cuda(
    cdef: CheckedDef,
    sizes: Mapping[str, int],
    options: MappingOptions,
    check: bool | None = None,
    device: DeviceProfile | None = None,
    count_loops: bool = False,
) -> LoweredCuda:
    """`device`: the GPU's profile (default: `tcpy.mapping.gpu.device.default_profile()`);
    `count_loops`: print a counting build, for the emulator (`Compiled.iterations`). A
    source past `SOURCE_LIMIT` is lowered again with `cuda_plain` options."""
    cdef = online_reductions(widen_half_reductions(cdef), options.online_tile)
    cdef = sliced_operands(cdef)  # an online chain's operands read apart, apart

    def lower(o: MappingOptions) -> LoweredCuda:
        return _within_limit(
            lambda p: _lower_to_cuda(cdef, sizes, p, check, device, count_loops), o, cuda_plain
        )

    try:
        return _in_step(lower, options)
    except SharedCopyInDivergentLoop:
        # a shared copy under a loop whose bounds differ between threads: no barrier
        # there can be reached by all, so the def runs from global memory
        lowered = lower(dataclasses.replace(options, use_shared_memory=False))
        note = "a shared-memory copy fell under a loop whose bounds differ between threads"
        return dataclasses.replace(lowered, fallbacks=(note, *lowered.fallbacks))


def _in_step(
    lower: Callable[[MappingOptions], LoweredCuda], options: MappingOptions
) -> LoweredCuda:
    """`lower(options)`; where a row kernel's AST splits its statements by lane
    (`RowsOutOfStep`), again without row fusion, then without row kernels."""
    try:
        return lower(options)
    except RowsOutOfStep:
        options = options.replace(fuse_rows=False)
    try:
        lowered = lower(options)
    except RowsOutOfStep:
        lowered = lower(options.replace(reduce_across_threads=False))
    note = "a row kernel's statements were split by lane"
    return dataclasses.replace(lowered, fallbacks=(note, *lowered.fallbacks))


def _lower_to_cuda(
    cdef: CheckedDef,
    sizes: Mapping[str, int],
    options: MappingOptions,
    check: bool | None,
    device: DeviceProfile | None,
    count_loops: bool,
) -> LoweredCuda:
    check = knobs.verify_schedules() if check is None else check
    # 1-3. Scop, dependences and isl's schedule, in bounded time (fallbacks on failure).
    analysis = _analyse(cdef, sizes, options, check)
    scop, deps, options = analysis.scop, analysis.deps, analysis.options
    fixed = sizes if options.fix_parameters_before_scheduling else None
    # 4. GPU mapping: one kernel per top-level nest, tiles on blocks, points on threads.
    scop.ctx.reset_operations()  # a stage of its own: its own budget of isl operations
    with log.stage("map"), isl_errors(f"mapping {cdef.name} to the GPU"):
        mapping = map_to_gpu(analysis.schedule, scop, options, device, sizes, deps)
        _verify(check, mapping.unbound, scop, deps)
    # 5. One isl AST per kernel, the block and thread ids bounded in its context.
    with log.stage("ast"):
        asts = tuple(
            build_ast(
                scop,
                mapping.schedule.intersect_domain(k.domain),
                mapping.context(scop, k),
                grouped=True,
            )
            for k in mapping.kernels
        )
    # 6. The CUDA printer: one __global__ function per kernel, or one for them all.
    fallbacks = analysis.fallbacks
    with log.stage("print"):
        try:
            source = print_cuda(scop, mapping, list(asts), options, fixed, count_loops)
        except OneKernelRefused as refused:
            options = options.replace(one_kernel=False)
            source = print_cuda(scop, mapping, list(asts), options, fixed, count_loops)
            fallbacks = (f"not one kernel: {refused}", *fallbacks)
    return LoweredCuda(
        cdef, options, scop, mapping, asts, source, fallbacks, analysis.clock_forced,
        exact=compares_floats(cdef),
    )  # fmt: skip


def _analyse(
    cdef: CheckedDef, sizes: Mapping[str, int], options: MappingOptions, check: bool
) -> Analysis:
    """The stages every target shares: the scop (parametric, or at the call's sizes),
    every order the program's meaning depends on, and isl's choice of loop order and
    fusion under the fusion strategy; each isl step bounded in time, with fallbacks."""
    with log.stage("schedule"):
        analysis = analyse(cdef, sizes, options)
        _verify(check, analysis.schedule, analysis.scop, analysis.deps)
    return analysis


def _verify(check: bool, schedule: isl.Schedule, scop: Scop, deps: Dependences) -> None:
    if check:
        verify(schedule, deps.validity, scop.domain)


L = TypeVar("L", Lowered, LoweredCuda)


def _within_limit(
    lower: Callable[[MappingOptions], L],
    options: MappingOptions,
    simpler: Callable[[MappingOptions], MappingOptions] = plain,
) -> L:
    """`lower(options)`, or, when its source passes `SOURCE_LIMIT`,
    `lower(simpler(options))` with the reason among its fallbacks."""
    lowered: L = lower(options)
    plainer = simpler(options)
    if len(lowered.source) <= SOURCE_LIMIT or plainer == options:
        return lowered
    again: L = lower(plainer)
    dropped = "tiles, " if plainer.tile == (0,) else ""
    note = (
        f"the generated code was {len(lowered.source) // 1024} KB (more than "
        f"{SOURCE_LIMIT // 1024} KB): lowered again without fusion, skewing, {dropped}"
        "register blocks and unrolling"
    )
    return dataclasses.replace(again, fallbacks=(*lowered.fallbacks, note, *again.fallbacks))
