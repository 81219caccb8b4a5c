"""The differential fuzzer (`tools/fuzz`) and its sandbox (`tcpy.sandbox`).

A few hundred fixed-seed (program, options) pairs run here on `cpu` and `cuda-emu`
against the reference; the long runs (`python -m tools.fuzz --n 10000`) are not part of
the suite. The sandbox is checked on tasks that fail in each of its classes.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tcpy
from tcpy.fuzz_tasks import replay
from tcpy.sandbox import Failure, Replay, Sandbox, WrongResult, run_tasks

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.fuzz.generate import generate  # noqa: E402
from tools.fuzz.mutate import mutate, seed_sources  # noqa: E402
from tools.fuzz.options import sample_options  # noqa: E402
from tools.fuzz.program import FLOAT, Bin, Decl, Invalid, Lin, Program, Read, Stmt, analyze  # noqa: E402
from tools.fuzz.run import fuzz, fuzz_frontend  # noqa: E402
from tools.fuzz.shrink import Case, shrink_case  # noqa: E402

# --- sandbox tasks (module level, so that workers can import them by name) -----------


def segfault() -> None:
    ctypes.string_at(0)


def sleep_forever() -> None:
    time.sleep(3600)


def value_error() -> None:
    raise ValueError("not a TCError")


def tc_error() -> None:
    raise tcpy.TCCompileError("the C compiler said no")


def wrong() -> None:
    raise WrongResult("output 0 differs")


def double(x: int) -> int:
    return 2 * x


@pytest.mark.parametrize(
    "fn, failure",
    [
        (segfault, Failure.CRASH),
        (sleep_forever, Failure.HANG),
        (value_error, Failure.INTERNAL_ERROR),
        (tc_error, Failure.COMPILE_ERROR),
        (wrong, Failure.WRONG_RESULT),
    ],
)
def test_sandbox_classifies(fn: object, failure: Failure) -> None:
    [(index, outcome)] = list(run_tasks(fn, [()], jobs=1, timeout=3))  # type: ignore[arg-type]
    assert index == 0 and outcome.failure is failure


def test_a_timeout_does_not_count_the_workers_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers whose interpreter takes 6 s to start (a `sitecustomize` that sleeps, as
    a loaded machine would) still run tasks with 4-second timeouts, after a crash too
    (4 s, not less: unpickling a task imports its module, slow on a loaded machine)."""
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(6)\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # workers get the parent's sys.path
    outcomes = dict(run_tasks(double, [(1,), (2,)], jobs=2, timeout=4))
    assert {k: (o.failure, o.value) for k, o in outcomes.items()} == {0: (None, 2), 1: (None, 4)}
    with Sandbox() as sb:
        assert sb.run(segfault, (), 5).failure is Failure.CRASH
        assert sb.run(double, (3,), 4).value == 6  # on a restarted worker


def test_sandbox_goes_on_after_a_crash() -> None:
    """A dead or killed worker is replaced; the other tasks still run."""
    with Sandbox() as sb:
        assert sb.run(segfault, (), 5).failure is Failure.CRASH
        assert sb.run(sleep_forever, (), 1).failure is Failure.HANG
        assert sb.run(double, (21,), 5).value == 42
    results = dict(run_tasks(double, [(i,) for i in range(6)], jobs=2, timeout=30))
    assert {i: o.value for i, o in results.items()} == {i: 2 * i for i in range(6)}


def test_replay_round_trip(tmp_path: Path) -> None:
    r = Replay(
        source="def f(float(N) A) -> (B) { B(i) = A(i) * 2.0 }",
        entry="f",
        sizes={"N": 17},
        input_seed=3,
        options=tcpy.MappingOptions(tile=(4,), unroll=2).to_dict(),
        target="cpu",
        failure=Failure.WRONG_RESULT.value,
        detail="recorded",
        meta={"generator_seed": 7},
    )
    path = tmp_path / "r.json"
    r.save(path)
    assert Replay.load(path) == r
    outcome = replay(path)
    assert outcome.failure is None and not outcome.invalid
    bad = dataclasses.replace(r, source="def f(float(N) A) -> (B) { B(i) = A(i) * }")
    bad.save(path)
    assert replay(path).invalid


# --- generator, options, shrinker, mutator ------------------------------------------


def test_generated_programs_pass_the_front_end() -> None:
    engine = tcpy.ExecutionEngine("reference")
    for seed in range(60):
        program = generate(random.Random(seed))
        analyze(program)
        engine.define(program.render())


def test_a_seed_gives_the_same_program_in_every_process() -> None:
    """A generator seed names one program wherever it is drawn: the row-chain draw
    hashed the generator's whole state, whose None hashes by its address in Python
    3.11, so another process (the shrinker test's under CI) drew another program."""
    code = (
        "import random; from tools.fuzz.generate import generate; "
        "print('|'.join(generate(random.Random(s)).render() for s in range(12)))"
    )
    root = Path(__file__).resolve().parent.parent
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("0", "2", "7")
    }
    assert len(outputs) == 1


def test_options_are_valid_and_cover_every_field() -> None:
    rng = random.Random(0)
    seen: dict[str, set[str]] = {}
    for _ in range(300):
        for name, value in sample_options(rng).to_dict().items():
            seen.setdefault(name, set()).add(repr(value))
    varied = {n for n, values in seen.items() if len(values) > 1}
    assert varied == set(seen)
    assert max(sample_options(rng).unroll for _ in range(200)) < 65535


def test_shrinker_finds_a_minimal_case() -> None:
    """A synthetic failure: any program with a `*=` statement fails while `tile` is set."""
    program = next(
        p for p in map(generate, map(random.Random, range(500)))
        if any(s.op.startswith("*=") for s in p.stmts) and len(p.stmts) >= 3
    )  # fmt: skip
    options = sample_options(random.Random(1)).replace(tile=(4, 4)).to_dict()

    def fails(c: Case) -> bool:
        return bool(c.options["tile"]) and any(s.op.startswith("*=") for s in c.program.stmts)

    small = shrink_case(Case(program, options), fails, seconds=30)
    assert fails(small)
    assert len(small.program.stmts) <= 2
    assert all(v <= 2 for v in small.program.sizes.values())
    default = tcpy.MappingOptions().to_dict()
    assert {k for k in small.options if small.options[k] != default[k]} == {"tile"}
    analyze(small.program)


def test_analysis_rejects_overflow() -> None:
    """A sum of 3-factor products over K terms is exact only while 27*K < 2**24."""
    a = Read("A", (Lin((("i", 1),)), Lin((("k", 1),))))
    st = Stmt("O", ("i",), "+=!", Bin("*", a, Bin("*", a, a)))
    program = Program("f", (Decl("A", FLOAT, ("N", "K")),), ("O",), (st,), {"N": 2, "K": 600_000})
    assert analyze(program).bounds["O"] == 27 * 600_000
    with pytest.raises(Invalid):
        analyze(dataclasses.replace(program, sizes={"N": 2, "K": 700_000}))


def test_chains_of_exponentials_are_what_the_online_rewrite_takes() -> None:
    """`online_chain` draws chains the online rewrite over tiles takes (most of them)
    and near misses it must refuse (some), every one accepted by the front end."""
    from tcpy.poly.online import online_reductions
    from tools.fuzz.generate import online_chain

    engine = tcpy.ExecutionEngine("reference")
    taken = kept = 0
    for seed in range(60):
        rng = random.Random(seed)
        while True:
            try:
                program = online_chain(rng)
                break
            except Invalid:
                continue
        assert program.smooth
        engine.define(program.render())
        rewritten = online_reductions(engine.checked(program.name), 3)
        taken, kept = taken + bool(rewritten.together), kept + (not rewritten.together)
    assert (taken, kept) == (53, 7)  # at these seeds; both kinds drawn


def test_smooth_outputs_are_compared_within_a_tolerance() -> None:
    """A pair of real values (`SMOOTH`) passes with the residue of another order of
    summation, fails past the tolerance, and needs NaN where the reference has it."""
    from tcpy.fuzz_tasks import close_outputs

    want = np.array([1.0, -3e3, 0.0, np.nan])
    assert close_outputs(want * (1 + 1e-12), want, 1e-9) is None
    assert (
        close_outputs(want + np.array([0, 0, 1e-7, 0]), want, 1e-9) is None
    )  # at the output's scale
    assert "differs at 1 of 4" in (
        close_outputs(want + np.array([0, 0, 1e-5, 0]), want, 1e-9) or ""
    )
    assert close_outputs(np.nan_to_num(want), want, 1e-9) is not None
    assert close_outputs(want.astype(np.float32), want, 1e-9) is not None


def test_outputs_that_cancel_are_compared_with_the_float64_def() -> None:
    """A float32 output that cancels (terms of both signs summing near zero) is
    compared with the def in float64, allowed twice the float32 reference's own error
    there: the fuzzer's pair of seed 5903017871 (a softmax-weighted mean whose weights,
    times signed inputs, sum to 3e-4 from terms of 0.44: condition 2,800), where the
    kernel's 1093.43 is nearer the float64 1093.32 than the float32 reference's
    1093.91. An output as far from both still fails."""
    from tcpy.fuzz_tasks import conditioned_outputs

    exact = np.array([1093.3169, 2.0, np.inf])
    want = np.array([1093.9127, 2.0, np.inf], np.float32)
    assert (
        conditioned_outputs(np.array([1093.4261, 2.0, np.inf], np.float32), want, exact, 1e-4)
        is None
    )
    for wrong in ([1096.0, 2.0, np.inf], [1093.4261, 2.5, np.inf], [1093.4261, 2.0, np.nan]):
        found = conditioned_outputs(np.array(wrong, np.float32), want, exact, 1e-4)
        assert found is not None and "differs at" in found, wrong


def test_an_ill_conditioned_pair_of_the_fuzzer_passes() -> None:
    """The whole pair of seed 5903017871 on `cpu`, float32 on smooth inputs."""
    from tcpy.fuzz_tasks import SMOOTH, check_against_reference

    source = """def f(float(L, R, Q) V, float(P, Q) LUT, float(P) T, float(P) B) -> (A) {
        tmp(w, i, b) +=! (V(w, i, r) * LUT(b, r))
        tmp(w, i, b) = (tmp(w, i, b) * 2.0)
        tmp(w, i, b) = (tmp(w, i, b) + T(b))
        C(w, i) max=! tmp(w, i, b)
        O(w, i, b) = (exp((tmp(w, i, b) - C(w, i))) * B(b))
        Y(w, i) +=! O(w, i, b)
        X(w, i) +=! (O(w, i, b) * tmp(w, i, b))
        A(w, i) = (X(w, i) / Y(w, i))
    }"""
    options = {  # the fuzzer's
        "outer_schedule_fusion": "Min",
        "intra_tile_schedule_fusion": "Max",
        "allow_skewing": True,
        "positive_orthant": False,
        "fix_parameters_before_scheduling": False,
        "tile": [3],
        "unroll": 64,
        "interchange": [],
        "register_tile": [2],
        "pack_operands": None,
        "map_to_blocks": [7],
        "map_to_threads": [2, 32],
        "reduce_across_threads": False,
        "split_reductions": True,
        "use_shared_memory": False,
        "use_private_memory": False,
        "unroll_copy_shared": False,
        "max_shared_memory": 0,
        "copy_stages": 2,
        "use_tensor_cores": True,
        "warp_tile": [64, 64],
        "input_precision": "tf32x3",
        "use_readonly_cache": False,
        "one_kernel": False,
        "shared_depth": 0,
        "private_depth": 3,
        "parallel": False,
        "vectorize": True,
        "fuse_rows": True,
        "fuse_epilogues": True,
        "online_tile": 8,
        "threads": 2,
    }
    sizes = {"R": 31, "L": 37, "P": 7, "Q": 16}
    check_against_reference(source, "f", sizes, 5903017871, options, "cpu", SMOOTH)


@pytest.mark.parametrize(("target", "n"), [("cpu", 16), ("cuda-emu", 8)])
def test_fuzz_online_chains(target: str, n: int, tmp_path: Path) -> None:
    """Chains of exponentials, most with the online rewrite over tiles on
    (`online_tile`: on `cuda-emu` a row kernel over tiles), within the tolerance of
    `SMOOTH` pairs."""
    summary = fuzz(target, n, seed=4, jobs=min(2, os.cpu_count() or 1), timeout=120,
                   out=tmp_path, shrink_seconds=0, log=None, online=True)  # fmt: skip
    assert summary.pairs == n and not summary.rejects, summary.line()
    assert not summary.failures, "\n".join(
        [summary.line()] + [p.read_text() for p in summary.saved]
    )


def test_mutator_keeps_the_front_end_honest(tmp_path: Path) -> None:
    rng = random.Random(0)
    assert len({mutate(t, rng) for t in seed_sources()[:20]}) > 10
    summary = fuzz_frontend(300, seed=1, jobs=2, out=tmp_path, log=None)
    assert summary.pairs == 300
    assert not summary.failures, [p.read_text() for p in summary.saved]


# --- the differential runs ----------------------------------------------------------


def _run(target: str, n: int, seed: int, tmp_path: Path) -> None:
    jobs = min(2, os.cpu_count() or 1)
    summary = fuzz(target, n, seed=seed, jobs=jobs, timeout=120, out=tmp_path,
                   shrink_seconds=0, log=None)  # fmt: skip
    assert summary.rejects <= n // 50, summary.line()
    assert not summary.failures, "\n".join(
        [summary.line()] + [p.read_text() for p in summary.saved]
    )


def test_fuzz_cpu(tmp_path: Path) -> None:
    _run("cpu", 120, seed=1, tmp_path=tmp_path)


def test_fuzz_cuda_emu(tmp_path: Path) -> None:
    _run("cuda-emu", 30, seed=2, tmp_path=tmp_path)


def test_fuzz_gradients(tmp_path: Path) -> None:
    """The gradient mode: generated programs' backwards compiled for cpu against the
    reference's and against central differences of the forward."""
    from tools.fuzz.run import fuzz

    summary = fuzz("cpu", 12, seed=3, jobs=2, timeout=300, out=tmp_path,
                   shrink_seconds=0, log=None, gradient=True)  # fmt: skip
    assert summary.pairs - summary.rejects >= 6, summary.line()
    assert not summary.failures, "\n".join(
        [summary.line()] + [p.read_text() for p in summary.saved]
    )


def test_the_gradient_check_catches_a_wrong_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backward off by a factor of 2 passes the comparison of compiled and reference
    (both run the same wrong text) and fails the finite differences."""
    import tcpy.autodiff
    from tcpy.fuzz_tasks import check_gradient
    from tcpy.sandbox import WrongResult

    source = "def f(float(N) A, float(N) B) -> (C) { C(i) = A(i) * B(i) + exp(A(i)) }"
    check_gradient(source, "f", {"N": 7}, 11, None, "cpu")
    derive = tcpy.autodiff.derive

    def doubled(src: str, name: str, *args: object, **kw: object) -> tcpy.autodiff.Derived:
        right = derive(src, name, *args, **kw)  # type: ignore[arg-type]
        wrong = right.backward.replace("d_A(i) = ", "d_A(i) = 2 * ", 1)
        return dataclasses.replace(right, backward=wrong)

    monkeypatch.setattr(tcpy.autodiff, "derive", doubled)
    with pytest.raises(WrongResult, match="central differences"):
        check_gradient(source, "f", {"N": 7}, 11, None, "cpu")


def test_a_gradient_near_a_pole_matches_the_extrapolated_differences() -> None:
    """`U / sum(U)` with signed weights whose sum is near zero (the gradient fuzzer's
    pair of seed 5905017720): the backward's -3.0228680e9 is right, and neither step's
    central difference is (-3.0295e9, -3.02293e9: the truncation error of order h^2);
    the two extrapolated to a step of 0 agree with it to 5e-8."""
    from tcpy.fuzz_tasks import check_gradient

    source = """def f(float(Q, R, P) O, float(P) Y) -> (acc, A) {
        V(n, r, kh) = O(n, r, kh)
        C(n, r) max=! V(n, r, kh)
        U(n, r, kh) = (exp((V(n, r, kh) - C(n, r))) * Y(kh))
        A(n, r) +=! U(n, r, kh)
        acc(n, r, kh) = (U(n, r, kh) / A(n, r))
    }"""
    check_gradient(source, "f", {"R": 13, "Q": 31, "P": 32}, 5905017720, None, "cpu")


def test_a_gathered_read_in_a_backward_stays_inside_the_solved_ranges() -> None:
    """`U(Z(m, m, m), m)` with `m` narrower than U's dimension: the adjoint's guard
    read `Z(m, m, m)` before checking `m`'s range, out of Z (the gradient fuzzer's
    find): the range checks now come first, the gathered equality last."""
    from tcpy.fuzz_tasks import check_gradient

    source = (
        "def f(int32(R, S, S) Z, float(R) Y, float(S) T, float(S, S) U) -> (C, X) {\n"
        "    C(i, n, s) +=! min(max((Z(kw, n, 1) + T(k)), (-9.0)), 9.0)"
        " where i in 0:S, n in 0:R, s in 0:R\n"
        "    C(d, w, r) = min(max((T(4) + Z(w, 2, r)), (-3.0)), 3.0)\n"
        "    X(m) = min((T(2*m + 2) + 2.0), (U(Z(m, m, m), m) + T(m)))\n"
        "}\n"
    )
    check_gradient(source, "f", {"R": 5, "S": 7}, 7301021975, None, "cpu")


_PLAIN = {
    "outer_schedule_fusion": "Preserve3Coincident",
    "intra_tile_schedule_fusion": "Preserve3Coincident", "allow_skewing": False,
    "positive_orthant": True, "fix_parameters_before_scheduling": False, "tile": [],
    "unroll": 1, "interchange": [], "register_tile": [], "pack_operands": None,
    "map_to_blocks": [], "map_to_threads": [], "reduce_across_threads": True,
    "split_reductions": True, "use_shared_memory": False, "use_private_memory": False,
    "unroll_copy_shared": True, "max_shared_memory": 0, "use_readonly_cache": False,
    "shared_depth": 0, "private_depth": 0, "parallel": True, "vectorize": True, "threads": 0,
}  # fmt: skip


@pytest.mark.parametrize(
    ("source", "sizes", "seed", "options", "target"),
    [
        (
            "def f(int32(K) O, float(1) B) -> (C) {\n"
            "    C(w, kh) min=! (O(kh) - (B(0) * O(w)))\n}\n",
            {"K": 9}, 7501022586, _PLAIN, "cpu",
        ),
        (
            "def f(float(S, S, S) acc, float(S) T) -> (Z, M) {\n"
            "    Z +=! T(c)\n"
            "    M(m, o) min=! Z where m in 0:S-1, o in 0:S\n"
            "    Z = 0.0\n}\n",
            {"S": 9}, 7601023529,
            {**_PLAIN, "fix_parameters_before_scheduling": True, "tile": [3, 33],
             "unroll": 8, "interchange": [0, 1], "register_tile": [0],
             "pack_operands": True, "map_to_threads": [32], "reduce_across_threads": False,
             "use_private_memory": True, "unroll_copy_shared": False, "shared_depth": 1,
             "private_depth": 1, "parallel": False, "threads": 1},
            "cuda-emu",
        ),
        (
            "def f(float(P, Q) V) -> (O) {\n"
            "    O(j) +=! ((-V(d, j)) - V(b, d))\n"
            "    O(e) min= 0.0\n}\n",
            {"P": 3, "Q": 3}, 7601024606, _PLAIN, "cuda-emu",
        ),
    ],
    ids=["fused-multiply-add", "sum-order", "sum-order-min"],
)  # fmt: skip
def test_ties_are_found_whatever_the_forward_computed(
    source: str, sizes: dict, seed: int, options: dict, target: str
) -> None:
    """A `max`/`min` backward compared recomputed values with the result the forward
    stored: gcc's fused multiply-add (cpu) or another order of a sum (the emulator)
    made them differ in the last bit, and the gradient was lost (the gradient
    fuzzer's finds). The backward now computes the result beside the values it
    compares, and a def that compares floats is compiled without contraction."""
    from tcpy.fuzz_tasks import check_gradient

    check_gradient(source, "f", sizes, seed, options, target)


def test_a_gradient_that_cancels_is_compared_at_the_scale_of_its_terms() -> None:
    """Every `A(kw) - A(r)` ties (K = 1), and `d_A(0)` sums 29,791 splits of the output
    gradients that cancel: another order of the sum leaves 1e-12, which an absolute
    tolerance of 1e-12 called a mismatch (the gradient fuzzer, cpu 7701023695). The
    tolerance scales with the output gradients' magnitudes."""
    from tcpy.fuzz_tasks import check_gradient

    source = (
        "def f(int32(K, S, K) B, float(K) A, int32(M, S) O) -> (C) {\n"
        "    C(n, l, j) min=! min(max((A(kw) - A(r)), (-100.0)), 100.0)"
        " where n in 0:S, l in 0:S, j in 0:S\n}\n"
    )
    options = {
        **_PLAIN, "outer_schedule_fusion": "Max", "allow_skewing": True,
        "fix_parameters_before_scheduling": True, "tile": [32, 33, 16, 2, 33], "unroll": 4,
        "interchange": [2, 1, 0], "register_tile": [2], "pack_operands": True,
        "parallel": False, "vectorize": False, "threads": 2,
    }  # fmt: skip
    check_gradient(source, "f", {"M": 37, "S": 31, "K": 1}, 7701023695, options, "cpu")


def test_a_temporary_read_under_a_condition_stays_in_global_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`T_ties(w)`, read under `?:` in a max's backward, was kept in shared memory by a
    row kernel while the guarded read, checked on the data, went to global memory,
    which nothing wrote (poison there: the gradient fuzzer, cuda-emu 7801023806). A
    temporary read under a condition or at a gathered subscript stays in global
    memory (`promotion.kernel_local`)."""
    from tcpy.fuzz_tasks import check_gradient

    monkeypatch.setenv("TCPY_POISON", "1")
    source = (
        "def f(float(Q, P) X, float(Q, L) B, float C, float(Q, 4) A) -> (Y, T) {\n"
        "    Y(s, h) = min(max(0, (-9)), 9) where s in 0:Q, h in 0:L\n"
        "    T(w) max=! min(max(X(w, b), (-100.0)), 100.0)\n}\n"
    )
    options = {
        **_PLAIN, "outer_schedule_fusion": "Max", "intra_tile_schedule_fusion": "Min",
        "positive_orthant": False, "fix_parameters_before_scheduling": True, "unroll": 8,
        "interchange": [2, 1, 0], "pack_operands": False, "map_to_blocks": [2],
        "map_to_threads": [32], "use_shared_memory": True, "use_private_memory": True,
        "private_depth": 2, "parallel": False, "vectorize": False, "threads": 1,
    }  # fmt: skip
    check_gradient(source, "f", {"Q": 5, "P": 33, "L": 3}, 7801023806, options, "cuda-emu")
