"""Runaway loops: kernels whose loops run far more iterations than the work their
statements hold, measured by counting builds (`Compiled.iterations`), and the mapping
defect that first made one (a member left whole by tiling it with a size meant to be
out of reach, which a size-generic schedule reached).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

import tcpy
from tcpy import kernels
from tcpy.mapping.options import MappingOptions
from tcpy.sandbox import RUN, Failure, Runaway, Sandbox, phase, run_tasks

from programs import MATMUL

COUNTED = ("cpu", "cuda-emu")

# Found by the differential fuzzer on cuda-emu: the second statement's member, shifted
# by H in a size-generic schedule, reached the sentinel tile 2**30, and every thread
# ran a loop of 2**30 iterations (right, after 28 to 53 s).
SHIFTED = """
def f(float(H, 2) A, float(H) lo, double scale, float32(2, 2) Mat) -> (Y1) {
    Y1(i, k) +=! A(i, j) * Mat(j, k)
    Y1(i, k) = fmax(Y1(i, k), 0.0)
}
"""
SHIFTED_OPTIONS = {
    "outer_schedule_fusion": "Preserve3Coincident", "positive_orthant": True,
    "fix_parameters_before_scheduling": False, "tile": [], "unroll": 8,
    "interchange": [3, 1, 4, 0, 2], "map_to_threads": [4, 128, 1],
    "use_shared_memory": False, "unroll_copy_shared": False, "max_shared_memory": 49152,
    "shared_depth": 3, "vectorize": False, "threads": 3,
}  # fmt: skip


def _shifted_inputs(h: int) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    rng = np.random.default_rng(h)
    a = rng.standard_normal((h, 2)).astype(np.float32)
    lo = rng.standard_normal(h).astype(np.float32)
    mat = rng.standard_normal((2, 2)).astype(np.float32)
    return a, lo, 0.5, mat


@pytest.mark.parametrize("target", COUNTED)
@pytest.mark.parametrize("h", [9, 1, 2, 31])
def test_a_shifted_size_generic_member_is_not_tiled_by_a_size_out_of_reach(
    target: str, h: int
) -> None:
    """The program and options the fuzzer found, right and with loops that run about
    as often as the def has statement instances (before the fix: a counting run
    stopped past its limit of 10^6 iterations on cuda-emu)."""
    engine = tcpy.ExecutionEngine(target)
    engine.define(SHIFTED)
    inputs = _shifted_inputs(h)
    kernel = engine.compile("f", *inputs, options=MappingOptions.from_dict(SHIFTED_OPTIONS))
    a, _, _, mat = inputs
    np.testing.assert_allclose(kernel(*inputs), np.maximum(a @ mat, 0), rtol=1e-5)
    counted = kernel.iterations(*inputs)
    assert counted.instances == 3 * h * 2 + h * 2  # init, the sum over j, the fmax
    assert not counted.stopped and not counted.runaway
    assert counted.total <= 4 * counted.instances + counted.threads
    assert "1073741823" not in kernel.source and "1073741824" not in kernel.source


ELEMENTWISE = "def f(float(N) A) -> (B) { B(i) = A(i) * 2.0 }"


def test_a_counting_build_counts_each_loop_once_per_iteration() -> None:
    """A loop over 37 elements tiled by 8 counts 5 tiles and 37 points, and a
    matmul's loops (tiles of 1: no point loops) count M, M*N and M*N*K."""
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(ELEMENTWISE)
    plain = MappingOptions(tile=(8,), vectorize=False, parallel=False, unroll=1)
    a = np.arange(37, dtype=np.float32)
    counted = engine.compile("f", a, options=plain).iterations(a)
    assert counted.loops == (5, 37) and counted.instances == 37 and counted.threads == 0
    engine.define(MATMUL)
    a, b = np.ones((5, 7), np.float32), np.ones((7, 3), np.float32)
    ones = plain.replace(tile=(1, 1, 1), register_tile=(1, 1))
    counted = engine.compile("mm", a, b, options=ones).iterations(a, b)
    assert sorted(counted.loops) == [5, 15, 105]
    assert counted.instances == 15 + 105


def test_an_emulated_kernel_counts_its_threads_and_their_loops() -> None:
    """On cuda-emu every thread runs its own loops: the launch's threads are counted
    beside the iterations, and a thread that has no element iterates no loop."""
    engine = tcpy.ExecutionEngine("cuda-emu")
    engine.define(ELEMENTWISE)
    a = np.arange(100, dtype=np.float32)
    options = MappingOptions.cuda().replace(map_to_threads=(32,), map_to_blocks=(2,))
    counted = engine.compile("f", a, options=options).iterations(a)
    assert counted.threads == 64 and counted.instances == 100
    assert counted.total >= 100 // 32  # the grid-stride loops of the blocks
    assert not counted.runaway


def test_the_kernels_own_calls_are_not_counted_and_stay_what_they_were() -> None:
    """`iterations` runs a counting build beside the kernel: the kernel's source has
    no counter, and its results do not change."""
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(ELEMENTWISE)
    a = np.arange(10, dtype=np.float32)
    kernel = engine.compile("f", a)
    kernel.iterations(a)
    assert "TC_COUNT_LOOP" not in kernel.source
    np.testing.assert_array_equal(kernel(a), 2 * a)


@pytest.mark.parametrize("target", COUNTED)
def test_a_counting_run_stops_at_its_limit(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a limit below the work (here: none), the run stops at once, whatever its
    loops would still do, and says so: a runaway ends in moments instead of running
    its loops out."""
    monkeypatch.setattr(kernels, "RUNAWAY_FACTOR", 0)
    monkeypatch.setattr(kernels, "RUNAWAY_FLOOR", 0)
    engine = tcpy.ExecutionEngine(target)
    engine.define(MATMUL)
    a, b = np.ones((64, 64), np.float32), np.ones((64, 64), np.float32)
    counted = engine.compile("mm", a, b).iterations(a, b)
    assert counted.stopped and counted.runaway
    assert counted.total < counted.instances  # stopped long before the work was done


def test_runaway_is_more_than_16_times_the_work_and_a_million_iterations() -> None:
    work = kernels.Iterations((1_900_000,), instances=100_000, threads=20_000)
    assert not work.runaway  # 1.9e6 <= 16 * 120,000
    assert kernels.Iterations((2_000_000,), instances=100_000, threads=0).runaway
    assert not kernels.Iterations((900_000,), instances=10, threads=0).runaway  # < 10^6


def test_loops_are_counted_on_host_targets_only() -> None:
    engine = tcpy.ExecutionEngine("reference")
    engine.define(ELEMENTWISE)
    a = np.ones(3, np.float32)
    with pytest.raises(tcpy.TCError, match="cpu and cuda-emu"):
        engine.compile("f", a).iterations(a)


# --- the sandbox's classes: runaway, and the run's own timeout ---------------------


def runs_away() -> None:
    raise Runaway("the loops ran 2e9 iterations")


def compiles_then_runs(compile_seconds: float, run_seconds: float) -> str:
    time.sleep(compile_seconds)
    phase(RUN)
    time.sleep(run_seconds)
    return "done"


def test_a_runaway_is_a_failure_class_of_its_own() -> None:
    [(_, outcome)] = list(run_tasks(runs_away, [()], jobs=1, timeout=5))
    assert outcome.failure is Failure.RUNAWAY and "2e9" in outcome.detail


def test_a_run_has_its_own_timeout_after_its_compile() -> None:
    """A compile may take longer than the run timeout; a run that takes longer than
    it is a hang, though the task's timeout is far from over."""
    with Sandbox() as sb:
        slow_compile = sb.run(compiles_then_runs, (2.0, 0.0), timeout=60, run_timeout=1)
        assert slow_compile.failure is None and slow_compile.value == "done"
        start = time.monotonic()
        slow_run = sb.run(compiles_then_runs, (0.0, 60.0), timeout=60, run_timeout=1)
        assert slow_run.failure is Failure.HANG and "run timeout" in slow_run.detail
        assert time.monotonic() - start < 30


# --- found by the fuzzer's runaway class and its first campaign ------------------------

DIAGONAL = """
def f(float(L, L) LUT, float(L, L) C, float(L, L) Z, float(L, L, L) X) -> (U) {
    tmp(n, m) min=! min(max(max(((-2.0) - n), (C(m, c) + LUT(c, c))), (-9.0)), 9.0) where n in 0:L-1
    U(k, b) *=! min(max(C(k, b), (-2.0)), 2.0)
}
"""
DIAGONAL_OPTIONS = {
    "outer_schedule_fusion": "Max", "intra_tile_schedule_fusion": "Preserve3Coincident",
    "allow_skewing": True, "positive_orthant": True, "fix_parameters_before_scheduling": False,
    "tile": [], "unroll": 8, "interchange": [], "register_tile": [5, 2], "pack_operands": True,
    "map_to_blocks": [2], "map_to_threads": [2], "reduce_across_threads": True,
    "split_reductions": False, "use_shared_memory": True, "use_private_memory": False,
    "unroll_copy_shared": False, "max_shared_memory": 0, "use_readonly_cache": False,
    "shared_depth": 0, "private_depth": 2, "parallel": True, "vectorize": False, "threads": 4,
}  # fmt: skip


@pytest.mark.parametrize("target", COUNTED)
def test_a_diagonal_is_not_copied_as_its_whole_box(target: str) -> None:
    """`LUT(c, c)` reads 37 elements of a 37 x 37 box (64 x 64 a tile on cuda-emu):
    copied into shared memory whole at each tile, its copy ran 17 times the work of
    the def. A footprint on a slice of fewer dimensions than its box is not copied
    (`promotion.box`); the def is right and its loops run about its work."""
    from tcpy.fuzz_tasks import check_against_reference

    check_against_reference(DIAGONAL, "f", {"L": 37}, 4001012415, DIAGONAL_OPTIONS, target)
    engine = tcpy.ExecutionEngine(target)
    engine.define(DIAGONAL)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in ((37, 37),) * 3 + ((37,) * 3,)]
    kernel = engine.compile("f", *inputs, options=MappingOptions.from_dict(DIAGONAL_OPTIONS))
    counted = kernel.iterations(*inputs)
    assert counted.total < 4 * (counted.instances + counted.threads)
    assert "tc_shared1[4160]" not in kernel.source  # LUT's 64 x 64 box


def test_a_thread_guard_with_an_else_branch_around_a_shared_copy() -> None:
    """isl put a guard on thread indices with an `else` above a shared-memory copy (an
    internal error): each branch now runs with the guard sunk into its copies, the
    `else` under the guard negated, every thread reaching every barrier."""
    from tcpy.fuzz_tasks import check_against_reference

    source = (
        "def f(float(R, R) U, float(R, R) O, float(L) B, float(L, L) tmp) -> (T, LUT, A) {\n"
        "    T(j) = (U(j, j) + tmp(j, j))\n"
        "    T(i25) += O(i26, i25 + i27) where i27 in 0:3\n"
        "    LUT(i29) min=! min(max(T(i30), (-8.0)), 8.0) where i29 in 0:R\n"
        "    A +=! min(max(R, (-100)), 100)\n"
        "}\n"
    )
    options = {
        **DIAGONAL_OPTIONS, "outer_schedule_fusion": "Preserve3Coincident",
        "positive_orthant": False, "tile": [16], "unroll": 2, "interchange": [0, 1],
        "register_tile": [0, 0, 3], "pack_operands": None, "map_to_threads": [],
        "unroll_copy_shared": True, "shared_depth": 3, "private_depth": 3, "parallel": False,
        "threads": 3,
    }  # fmt: skip
    sizes = {"R": 7, "L": 1}
    check_against_reference(source, "f", sizes, 4001012747, options, "cuda-emu", "exact-nan")


def test_a_size_generic_kernel_launches_no_more_blocks_than_its_tiles() -> None:
    """A CUDA kernel is built per shape, even from a schedule for any size: its grid is
    sized at the sizes it is launched at. With the grid the options asked for (256 x 16
    blocks of 128 threads) kept whole, 99% of the threads had no tile, yet each ran
    the sequential loop around the grid's loops: 17.8 million iterations for 65,352
    statement instances, a runaway (found by the fuzzer)."""
    source = (
        "def f(float(float4, 4) tmp, float(float4) new, float(float4, float4) class)"
        " -> (acc, T) {\n"
        "    acc(m) = new(m)\n"
        "    T(S0, union, r) min=! acc(true) where S0 in 0:float4-1, union in 0:float4,"
        " r in 0:float4-1\n"
        "}\n"
    )
    options = {
        "outer_schedule_fusion": "Max", "intra_tile_schedule_fusion": "Max",
        "fix_parameters_before_scheduling": False, "tile": [0, 4, 32, 1], "unroll": 16,
        "interchange": [1, 0], "register_tile": [3, 1], "map_to_blocks": [256, 16],
        "use_shared_memory": False, "use_private_memory": True, "use_readonly_cache": True,
    }  # fmt: skip
    engine = tcpy.ExecutionEngine("cuda-emu")
    engine.define(source)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in ((16, 4), (16,), (16, 16))]
    kernel = engine.compile("f", *inputs, options=MappingOptions.from_dict(options))
    acc, t = kernel(*inputs)
    np.testing.assert_array_equal(acc, inputs[1])
    np.testing.assert_array_equal(t, np.full((15, 16, 15), inputs[1].min(), np.float32))
    counted = kernel.iterations(*inputs)
    assert not counted.runaway
    # T's two kernels on its 4 x 1 tiles of 32 x 4 threads, acc's 16 blocks of one thread
    assert counted.threads == 2 * 4 * 128 + 16  # not the 2 x 4096 blocks of 128 asked for


FIVE_DIMENSIONS = """def f(float U, int32(P) X) -> (C, T) {
    C(k, r) min=! U where k in 0:P-1, r in 0:P
    T(kh, kw, l) min=! (-(float(X(X(i))) * (2.0 * C(i, n))))
        where kh in 0:P, kw in 0:P-1, l in 0:P-1
    C(c, b) min=! min(max(max((-3.0), U), (-3.0)), 3.0)
}
"""


def test_the_work_of_a_domain_of_five_dimensions_is_counted() -> None:
    """isl's count of a five-dimensional domain (T's, 37^5 instances) passed the
    context's operation budget, and the counting run failed (an internal error the
    fuzzer found): the work of a def is the product of its statements' ranges."""
    from tcpy.fuzz_tasks import check_against_reference
    from tcpy.parser import check_source
    from tcpy.poly.scop import instances

    cdef = check_source(FIVE_DIMENSIONS)["f"]
    p = 37
    # C: (P-1) x P, initialised and written, twice; T: P x (P-1) x (P-1) initialised,
    # and reduced over i in 0:P-1 (C's rows) and n in 0:P
    want = 2 * (p - 1) * p + p * (p - 1) ** 2 + p * (p - 1) ** 2 * (p - 1) * p + 2 * (p - 1) * p
    assert instances(cdef, {"P": p}) == want
    options = {
        "outer_schedule_fusion": "Max", "intra_tile_schedule_fusion": "Min",
        "allow_skewing": True, "positive_orthant": False,
        "fix_parameters_before_scheduling": False, "tile": [15, 33, 0, 31], "unroll": 8,
        "interchange": [3, 1, 0, 2], "register_tile": [3, 1], "pack_operands": False,
        "map_to_blocks": [7], "map_to_threads": [64, 3, 1], "reduce_across_threads": False,
        "split_reductions": False, "use_shared_memory": False, "use_private_memory": True,
        "unroll_copy_shared": True, "max_shared_memory": 49152, "use_readonly_cache": False,
        "shared_depth": 0, "private_depth": 2, "parallel": True, "vectorize": False,
        "threads": 1,
    }  # fmt: skip
    check_against_reference(FIVE_DIMENSIONS, "f", {"P": p}, 3401014346, options, "cpu")


def test_counted_work_is_isls_count_of_the_domains() -> None:
    """On the corpus at its test sizes, the product of the ranges is what isl counts."""
    import warnings

    from tcpy.parser import check_source
    from tcpy.poly.scop import build_scop, instances

    from corpus_cases import CASES

    for case in CASES[:60]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            source = (Path(__file__).parent / "corpus" / case.file).read_text()
            cdef = check_source(source)[case.entry]
        scop = build_scop(cdef, case.sizes)
        counted = sum(s.domain.count_val().to_python() for s in scop.statements)
        assert instances(cdef, case.sizes) == counted, case.name


SCATTERED = """def f(float(ceild) C, float(K, K, N) U) -> (tmp) {
    HUGE_VALF(kw, w) max=! min(max(fmin(min(C(union), U(kw, w, kw)),
        (C(union) * U(float4, kw, w))), (-9.0)), 9.0)
    tmp(d) min=! min(max((((HUGE_VALF(d, int) * HUGE_VALF(d, 2*d + j))
        * (U(d, 2*d + m, d) - U(d, 3*d + nan, d))) > (((-3.0) + U(d, 0, d + kh)) - C(d))
        ? max((d + d), (2.0 * HUGE_VALF(d, d))) : (U(d, d + p0, d) - HUGE_VALF(d, d + n))),
        (-9.0)), 9.0) where j in 0:3, m in 0:4, nan in 0:1, kh in 0:2, p0 in 0:3, n in 0:1
}
"""


def test_reads_far_apart_are_not_packed_as_one_box() -> None:
    """`U(c0 + c4, c1, c0 + c4)` and `U(c3, c0 + c4, c1)` read 56 elements of U in the
    innermost loop, and their box spans 37 x 33 x 33: packed at each iteration, the
    copies ran 16 times the work of the def (a runaway the fuzzer found on cpu). A
    footprint whose box holds more than `SCATTER` times its pieces' boxes is not
    copied (`promotion._scattered`)."""
    from tcpy.fuzz_tasks import check_against_reference

    options = {
        "outer_schedule_fusion": "Min", "intra_tile_schedule_fusion": "Max",
        "allow_skewing": True, "positive_orthant": False,
        "fix_parameters_before_scheduling": False, "tile": [7], "unroll": 4,
        "interchange": [], "register_tile": [], "pack_operands": True, "map_to_blocks": [],
        "map_to_threads": [2, 8], "reduce_across_threads": False, "split_reductions": True,
        "use_shared_memory": True, "use_private_memory": False, "unroll_copy_shared": True,
        "max_shared_memory": 0, "use_readonly_cache": True, "shared_depth": 2,
        "private_depth": 3, "parallel": True, "vectorize": True, "threads": 3,
    }  # fmt: skip
    sizes = {"N": 33, "K": 37, "ceild": 7}
    check_against_reference(SCATTERED, "f", sizes, 3401016875, options, "cpu")


BUDGET = """def f(int32(N) tmp) -> (X, A, O) {
    X(r) = fmax(tmp(r), tmp(r)) where r in 0:N-1
    B(kh, kw, m) +=! min(max((((tmp(l) == tmp(kh) ? (-1.0) : X(kw)) - X(l))
        == (X(m + b) * X(m)) ? ((N >= tmp(l) ? tmp(tmp(m)) : X(kh)) * tmp(3*m))
        : (copysign(tmp(kh), N) * (X(w) + m))), (-9.0)), 9.0) where b in 0:3
    A(s, i24) +=! min(max(fma((X(s) + min(max(B(i25, s, s), (-8.0)), 8.0)),
        (tmp(tmp(i24)) * tmp(i24)), (tmp(i24) - X(s))), (-100.0)), 100.0)
    X(i26) min=! min(max(((min(max(B(i27, i27, i29), (-8.0)), 8.0) + tmp(i26))
        * (-tmp(i26))), (-3.0)), 3.0)
    O(i31, i32, i33) = min(max(B(i33, i33, i33), (-8.0)), 8.0) where i31 in 0:N-1, i32 in 0:N
}
"""


def test_the_source_order_schedule_holds_when_isl_runs_out_of_operations() -> None:
    """isl gave up scheduling this def, and the schedule of last resort (source order)
    coalesced every dependence to mark its parallel loops: past the operation budget,
    an internal error the fuzzer found (cpu, pair 3501013119). The dependences are no
    longer coalesced there, and a member isl cannot clear within the budget is taken
    as not parallel (`schedule._carries`)."""
    from tcpy.fuzz_tasks import check_against_reference

    options = {
        "outer_schedule_fusion": "Max", "intra_tile_schedule_fusion": "Preserve3Coincident",
        "allow_skewing": False, "positive_orthant": False,
        "fix_parameters_before_scheduling": False, "tile": [3, 17, 8, 0, 0], "unroll": 8,
        "interchange": [], "register_tile": [2, 5, 0], "pack_operands": True,
        "map_to_blocks": [2], "map_to_threads": [1, 1], "reduce_across_threads": False,
        "split_reductions": False, "use_shared_memory": True, "use_private_memory": True,
        "unroll_copy_shared": True, "max_shared_memory": 1024, "use_readonly_cache": False,
        "shared_depth": 0, "private_depth": 3, "parallel": False, "vectorize": False,
        "threads": 4,
    }  # fmt: skip
    check_against_reference(BUDGET, "f", {"N": 9}, 3501013119, options, "cpu")


LARGE = """def f(int32(P) tmp, float(P, P) T, int32(P, P) acc) -> (C, V) {
    C(h, k) min=! T(w, tmp(w)) where h in 0:P-1, k in 0:P-1
    V(j, n, kh) min=! min(max((tmp(n) * ((acc(n, j) - acc(r, 23)) > (tmp(r) * tmp(kh))
        ? C(tmp(r), n + 1) : (P * tmp(kh)))), (-3.0)), 3.0)
    V(d, m, b) max= (acc(tmp(c), c) + (acc(b, c) * (acc(b + i22, m) - T(m, d)))) where i22 in 0:4
    C(i23, i24) max= min(max(min(max(V(i23, i25, i23), (-8.0)), 8.0), (-3.0)), 3.0)
    V(i26, i27, i28) += min(max(max((-(T(0, i28) + 0)), (-(min(max(C(0, i26), (-8.0)), 8.0)
        * acc(i27, i27)))), (-9.0)), 9.0)
}
"""
LARGE_OPTIONS = {
    "outer_schedule_fusion": "Max", "intra_tile_schedule_fusion": "Preserve3Coincident",
    "allow_skewing": True, "positive_orthant": False,
    "fix_parameters_before_scheduling": False, "tile": [32, 7, 17, 64], "unroll": 16,
    "interchange": [2, 1, 0], "register_tile": [0], "pack_operands": True,
    "map_to_blocks": [64, 1], "map_to_threads": [4], "reduce_across_threads": False,
    "split_reductions": True, "use_shared_memory": True, "use_private_memory": False,
    "unroll_copy_shared": False, "max_shared_memory": 49152, "use_readonly_cache": True,
    "shared_depth": 3, "private_depth": 0, "parallel": False, "vectorize": True, "threads": 1,
}  # fmt: skip


def test_a_generated_source_too_large_to_compile_is_lowered_again_plainly() -> None:
    """Fused, skewed and tiled at sizes known only at run time, this def's schedule
    printed 500 KB of C (1,464 loops), which gcc took over 5 minutes to compile: a
    pair the fuzzer stopped (cpu, 3501011160). Past `SOURCE_LIMIT` the def is lowered
    again with `plain` options, and says so among its fallbacks."""
    from tcpy.fuzz_tasks import check_against_reference
    from tcpy.mapping.options import MappingOptions
    from tcpy.parser import check_source
    from tcpy.pipeline import SOURCE_LIMIT, lower_to_c

    cdef = check_source(LARGE)["f"]
    lowered = lower_to_c(cdef, {"P": 33}, MappingOptions.from_dict(LARGE_OPTIONS))
    assert len(lowered.source) <= SOURCE_LIMIT
    assert any("lowered again without fusion" in f for f in lowered.fallbacks)
    assert lowered.options.tile == (0,) and lowered.options.unroll == 1
    check_against_reference(LARGE, "f", {"P": 33}, 3501011160, LARGE_OPTIONS, "cpu")


HEAVY_BLOCK = """def f(float(L) tmp, float(K, P) O, int32 Z, float(P, L) X, int32(K, L) B)
    -> (U, V, acc) {
    LUT(d) +=! O(m, m) where d in 0:P
    LUT(w) min=! min(max((X(0, 0) - O(w, s)), (-9.0)), 9.0)
    U(kh) min=! min(max(float(B(kh, h)), (-9.0)), 9.0)
    V(r, n) +=! U(c) where r in 0:K, n in 0:K
    acc(l, j, kw) +=! min(max((max(2, tmp(l + 2)) + (j * X(l, i))), (-3.0)), 3.0)
        where j in 0:K-1, kw in 0:K-1
}
"""


def test_a_register_block_asked_for_is_held_to_a_budget() -> None:
    """`register_tile: [1, 32, 8]` on `V(r, n) +=! U(c)` asked for a block of 32 x 8
    outputs of 8 lanes each, unrolled whole: 256 copies of a vector loop, 90 s of gcc
    (a pair the fuzzer stopped, cpu 3501013608). A block holds at most `MAX_BLOCK`
    elements."""
    import re

    from tcpy.fuzz_tasks import check_against_reference
    from tcpy.mapping.cpu.registers import MAX_BLOCK
    from tcpy.mapping.options import MappingOptions
    from tcpy.parser import check_source
    from tcpy.pipeline import lower_to_c

    options = {
        "outer_schedule_fusion": "Min", "intra_tile_schedule_fusion": "Min",
        "allow_skewing": True, "positive_orthant": True,
        "fix_parameters_before_scheduling": False, "tile": [0], "unroll": 16,
        "interchange": [3, 0, 1, 2], "register_tile": [1, 32, 8], "pack_operands": False,
        "map_to_blocks": [16], "map_to_threads": [1], "reduce_across_threads": True,
        "split_reductions": False, "use_shared_memory": True, "use_private_memory": True,
        "unroll_copy_shared": False, "max_shared_memory": 1024, "use_readonly_cache": False,
        "shared_depth": 1, "private_depth": 3, "parallel": False, "vectorize": True,
        "threads": 2,
    }  # fmt: skip
    sizes = {"L": 5, "K": 2, "P": 2}
    cdef = check_source(HEAVY_BLOCK)["f"]
    source = lower_to_c(cdef, sizes, MappingOptions.from_dict(options)).source
    blocks = [re.findall(r"\[(\d+)\]", b) for b in re.findall(r"tc_reg((?:\[\d+\])+);", source)]
    assert blocks and all(math.prod(int(n) for n in b) <= MAX_BLOCK for b in blocks), blocks
    check_against_reference(HEAVY_BLOCK, "f", sizes, 3501013608, options, "cpu")


SHARED_UNDER_DIVERGENT_LOOP = """
def f(float(while, while) A, float(threadIdx, 3) U, float(while, threadIdx, threadIdx) LUT, int32(while) V) -> (HUGE_VALF, tmp, O, case) {
    HUGE_VALF(not, short) = U(short, V(not))
    HUGE_VALF(h, kw) max= min(max(((-2.0) * A(h, m)), (-9.0)), 9.0)
    tmp(r) +=! trunc(HUGE_VALF(w, 2)) where r in 0:while-1
    O(b, fminf, floord) *=! min(max(floord, (-2)), 2) where b in 0:while-1, fminf in 0:while-1, floord in 0:while
    case(k) *=! min(max(O(d, d, const), (-1)), 1) where k in 0:threadIdx-1
}
"""  # noqa: E501 (the pair as the fuzzer drew it)


def test_a_shared_copy_under_a_loop_the_threads_bound_differently_falls_back() -> None:
    """A shared-memory copy whose barriers fell under a loop with bounds that differ
    between threads (cuda-emu campaign pair 5201017316: an internal error): the def
    is mapped again without shared memory, said among the fallbacks, and runs right."""
    from tcpy.fuzz_tasks import check_against_reference
    from tcpy.parser import check_source
    from tcpy.pipeline import lower_to_cuda

    options = {
        "outer_schedule_fusion": "Max",
        "intra_tile_schedule_fusion": "Max",
        "allow_skewing": False,
        "positive_orthant": False,
        "fix_parameters_before_scheduling": False,
        "tile": [4, 3, 2],
        "unroll": 64,
        "interchange": [],
        "register_tile": [0],
        "pack_operands": False,
        "map_to_blocks": [64, 64],
        "map_to_threads": [8, 64, 2],
        "reduce_across_threads": True,
        "split_reductions": False,
        "use_shared_memory": True,
        "use_private_memory": True,
        "unroll_copy_shared": False,
        "max_shared_memory": 0,
        "use_readonly_cache": True,
        "shared_depth": 1,
        "private_depth": 1,
        "parallel": True,
        "vectorize": True,
        "threads": 1,
    }
    sizes = {"while": 4, "threadIdx": 4}
    check_against_reference(
        SHARED_UNDER_DIVERGENT_LOOP, "f", sizes, 5201017316, options, "cuda-emu"
    )
    cdef = check_source(SHARED_UNDER_DIVERGENT_LOOP)["f"]
    lowered = lower_to_cuda(cdef, sizes, MappingOptions.from_dict(options))
    assert not lowered.options.use_shared_memory
    assert any("shared-memory copy" in f for f in lowered.fallbacks)


def test_a_cuda_source_past_the_limit_keeps_the_mappings_own_tiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On CUDA the plain options keep the mapping's tiles: they make the grid and the
    blocks, not more code. With `tile=(0,)`, as for C, every output ran in a block of
    one thread (a bfloat16 BERT layer past the limit: 12x slower on an H100)."""
    from tcpy import pipeline
    from tcpy.mapping.gpu import cuda_defaults
    from tcpy.parser import check_source

    (cdef,) = check_source(MATMUL).values()
    sizes = {"M": 256, "K": 256, "N": 256}
    full = pipeline.lower_to_cuda(cdef, sizes, cuda_defaults(cdef))
    monkeypatch.setattr(pipeline, "SOURCE_LIMIT", len(full.source) - 1)
    lowered = pipeline.lower_to_cuda(cdef, sizes, cuda_defaults(cdef))
    assert any("lowered again without fusion" in f for f in lowered.fallbacks)
    assert "tiles" not in lowered.fallbacks[-1]
    assert all(kernel.threads >= 32 for kernel in lowered.mapping.kernels)
