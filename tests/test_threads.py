"""The `cpu` target's threads: one OpenMP region per kernel, its size chosen at each
call (`MappingOptions.threads`, else `TCPY_NUM_THREADS`, else `OMP_NUM_THREADS`, else
the cores), never compiled in."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable

import numpy as np
import pytest

import tcpy
from tcpy import knobs
from tcpy.codegen.region import BARRIER_C, WAIT
from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.parser import check_source
from tcpy.pipeline import lower_to_c
from tcpy.runtime import cpu, threads, toolchain

from programs import CONV, LAYERNORM, MATMUL, SOFTMAX

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_thread_count_comes_from_the_options_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TCPY_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert knobs.cpu_threads() is None  # the runtime counts the free cores
    monkeypatch.setenv("OMP_NUM_THREADS", "5,2")  # one value per nesting level
    assert knobs.cpu_threads() == 5
    monkeypatch.setenv("OMP_NUM_THREADS", "many")  # OpenMP ignores it too
    assert knobs.cpu_threads() is None
    monkeypatch.setenv("TCPY_NUM_THREADS", "3")
    assert knobs.cpu_threads() == 3
    assert knobs.cpu_threads(7) == 7
    assert threads.threads_now() == 3


def test_without_a_count_kernels_leave_the_cores_other_processes_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TCPY_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(knobs, "cores", lambda: 4)
    monkeypatch.setattr(threads, "_LOAD", threads.Load(interval=0))
    monkeypatch.setattr(threads, "runnable_elsewhere", lambda: 1)
    assert threads.threads_now() == 3
    monkeypatch.setattr(threads, "runnable_elsewhere", lambda: 9)
    assert threads.threads_now() == 3  # the least of the last three samples: 1, 9
    threads.threads_now()
    assert threads.threads_now() == 1  # 9, 9, 9: never fewer than one thread
    assert threads.threads_now(2) == 2  # the options' count is kept


def test_a_small_call_runs_on_one_thread_unless_more_are_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Below `SERIAL_WORK` statement instances a team costs more than it shares: the
    kernel runs on one thread, unless the options or the environment give a count."""
    monkeypatch.delenv("TCPY_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(knobs, "cores", lambda: 4)
    monkeypatch.setattr(threads, "_LOAD", threads.Load(interval=0))
    monkeypatch.setattr(threads, "runnable_elsewhere", lambda: 0)
    assert threads.threads_now(0, threads.SERIAL_WORK - 1) == 1
    assert threads.threads_now(0, threads.SERIAL_WORK) == 4
    assert threads.threads_now(3, 10) == 3
    monkeypatch.setenv("TCPY_NUM_THREADS", "2")
    assert threads.threads_now(0, 10) == 2
    monkeypatch.delenv("TCPY_NUM_THREADS")
    seen: list[int | None] = []
    monkeypatch.setattr(cpu, "threads_now", lambda asked, work, trials=None: seen.append(work) or 1)
    engine = tcpy.ExecutionEngine("cpu")
    engine.define("def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }")
    small, large = np.ones(16, np.float32), np.ones(1 << 16, np.float32)
    engine.add(small, small)
    engine.add(large, large)
    assert seen == [16, 1 << 16]  # the kernel's work at each call's sizes


def test_the_load_is_sampled_at_most_once_an_interval() -> None:
    load = threads.Load(interval=0.05, samples=3)
    taken: list[float] = []

    def sample(value: int | None) -> Callable[[], int | None]:
        def read() -> int | None:
            taken.append(value or 0)
            return value

        return read

    assert load.busy_elsewhere(0.0, sample(2)) == 2
    assert load.busy_elsewhere(0.01, sample(5)) == 2  # too soon: not sampled
    assert load.busy_elsewhere(0.06, sample(None)) == 2  # unknown: not counted
    assert load.busy_elsewhere(0.12, sample(5)) == 2
    assert load.busy_elsewhere(0.18, sample(4)) == 2
    assert load.busy_elsewhere(0.24, sample(6)) == 4  # 2 is older than the last three
    assert taken == [2, 0, 5, 4, 6]


@pytest.mark.skipif(not os.path.exists("/proc/loadavg"), reason="reads /proc")
def test_a_busy_process_is_counted() -> None:
    busy = subprocess.Popen(
        [sys.executable, "-c", "import sys\nprint(flush=True)\nwhile True: pass"],
        stdout=subprocess.PIPE,
    )
    try:
        assert busy.stdout is not None
        busy.stdout.readline()  # it runs
        assert max(threads.runnable_elsewhere() or 0 for _ in range(20)) >= 1
    finally:
        busy.kill()
        busy.wait()


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_thread_count_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    engine = tcpy.ExecutionEngine("cpu")
    engine.define("def f(float(N) A) -> (B) { B(i) = A(i) + 1 }")
    monkeypatch.setenv("TCPY_NUM_THREADS", value)
    with pytest.raises(tcpy.TCLaunchError, match="TCPY_NUM_THREADS"):
        engine.f(np.ones(64, np.float32))


# Run in a fresh process: the threads OpenMP starts stay in its pool, and the test counts
# the process's threads (libgomp grows the pool to the largest region it has run).
_COUNT_THREADS = f"""
import os
import numpy as np
import tcpy

def threads():
    return len(os.listdir("/proc/self/task"))

engine = tcpy.ExecutionEngine("cpu")
engine.define({MATMUL!r})
a = np.ones((256, 256), np.float32)
engine.mm(a, a)  # built, and run on the 2 threads of TCPY_NUM_THREADS
base = threads()
os.environ["TCPY_NUM_THREADS"] = "4"
assert (engine.mm(a, a) == 256).all()
grown = threads()
assert (engine.mm(a, a, options=engine.compile("mm", a, a).options.replace(threads=6)) == 256).all()
print(base, grown, threads(), engine.stats.compiles)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_the_thread_count_is_read_at_each_call_and_costs_no_build(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "TCPY_NUM_THREADS": "2", "TCPY_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_COUNT_THREADS)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    base, grown, last, compiles = (int(v) for v in done.stdout.split())
    assert (grown - base, last - grown) == (2, 2)  # a pool of 2, then of 4, then of 6
    assert compiles == 1


def _source(text: str, entry: str, sizes: dict[str, int], options: MappingOptions) -> str:
    cdef = check_source(text)[entry]
    return lower_to_c(cdef, sizes, options).source


def test_independent_nests_share_one_region_without_a_barrier() -> None:
    text = "def f(float(N) A, float(N) B) -> (X, Y) { X(i) = A(i) * 2.0\n Y(i) = B(i) + 1.0 }"
    source = _source(text, "f", {"N": 4096}, MappingOptions.cpu())
    assert source.count("#pragma omp parallel") == 1
    assert source.count("#pragma omp for") == 2
    assert source.count(WAIT) == 1  # the region's end only


def test_a_nest_waits_for_the_nest_it_reads() -> None:
    text = "def f(float(N) A) -> (X, Y) { X(i) = A(i) * 2.0\n Y(i) = X(N - 1 - i) + 1.0 }"
    options = MappingOptions.cpu().replace(outer_schedule_fusion=Fusion.MIN)
    source = _source(text, "f", {"N": 4096}, options)
    assert source.count("#pragma omp parallel") == 1
    assert source.count(WAIT) == 2  # between the nests, and the region's end
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(text)
    a = np.random.default_rng(0).random(4096, dtype=np.float32)
    x, y = engine.f(a, options=options)
    np.testing.assert_array_equal(x, a * 2)
    np.testing.assert_array_equal(y, (a * 2)[::-1] + 1)


_PHASES = r"""
#include <stdio.h>
#include <time.h>
int omp_get_thread_num(void);
int main(void) {
  static int wrote[8][400];
  tc_barrier_t barrier = {0, 0, 0};
  int stale = 0;
  #pragma omp parallel num_threads(THREADS)
  {
    const int me = omp_get_thread_num(), team = omp_get_num_threads();
    for (int phase = 0; phase < 400; phase++) {
      wrote[me][phase] = phase + 1;
      if (phase % 40 == me) {  /* one thread late by 2 ms: the others sleep */
        struct timespec late = {0, 2000000};
        nanosleep(&late, NULL);
      }
      tc_barrier(&barrier, team, 1000);
      for (int other = 0; other < team; other++)
        if (__atomic_load_n(&wrote[other][phase], __ATOMIC_RELAXED) != phase + 1)
          __atomic_add_fetch(&stale, 1, __ATOMIC_RELAXED);
    }
  }
  printf("%d %u %u\n", stale, barrier.phase, barrier.arrived);
  return 0;
}
"""


@pytest.mark.parametrize("count", [2, 5])
def test_the_kernels_barrier_shows_each_thread_what_the_others_wrote(
    tmp_path,
    count: int,  # type: ignore[no-untyped-def]
) -> None:
    """The kernels' own barrier (`BARRIER_C`), on its own: after each of 400 phases
    every thread sees what every other wrote before it, including where one thread
    arrives 2 ms late and the others have gone to sleep, and with more threads than
    cores; no phase is lost or repeated, and the count of arrivals is back to 0."""
    source = tmp_path / "phases.c"
    source.write_text(BARRIER_C + _PHASES.replace("THREADS", str(count)))
    binary = tmp_path / "phases"
    command = [toolchain.c_compiler(), "-O2", "-fopenmp", "-o", str(binary), str(source)]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    done = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["0", "400", "0"]


def test_code_outside_the_parallel_loops_runs_once() -> None:
    """A reduction over the whole of a tensor has no parallel loop: it runs in one thread
    of the region (`omp single`), after the nest it reads."""
    text = "def f(float(N) A) -> (X, S) { X(i) = A(i) * 2.0\n S +=! X(i) }"
    source = _source(text, "f", {"N": 4096}, MappingOptions.cpu())
    assert "#pragma omp single" in source
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(text)
    a = np.random.default_rng(1).random(4096, dtype=np.float32)
    for count in (1, 2, 5):
        x, s = engine.f(a, options=MappingOptions.cpu().replace(threads=count))
        np.testing.assert_array_equal(x, a * 2)
        np.testing.assert_allclose(s, 2 * a.sum(dtype=np.float64), rtol=1e-5)


SCATTER = """def f(float(B, D) G, int32(B, L) idx) -> (E) {
    E(i, j) = 0.0 where i in 0:V, j in 0:D
    E(idx(b, l), d) += G(b, d) where b in 0:B, d in 0:D, l in 0:L
}"""


@pytest.mark.parametrize(("width", "shared"), [(64, False), (8192, True)])
def test_a_parallel_loop_inside_sequential_loops_is_shared_only_when_large(
    width: int, shared: bool
) -> None:
    """An embedding bag's backward scatters rows of `D` values at every bag and
    position in turn (two sequential loops): sharing the rows among the threads ends
    each of the 1,024 sequential steps in a barrier. Rows of 64 run on one thread
    (`omp single`); rows of 8,192 are shared out (`omp for` inside the sequential
    loops). Both give the reference's sums."""
    text = SCATTER.replace("0:V", "0:100")
    sizes = {"B": 128, "L": 8, "D": width}
    source = _source(text, "f", sizes, MappingOptions.cpu())
    scatter = source[source.rindex("E(idx(b, l), d) +=") :]
    assert ("#pragma omp for" in scatter) is shared, scatter
    assert ("#pragma omp single" in scatter) is not shared, scatter
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(text)
    rng = np.random.default_rng(2)
    g = rng.random((128, width), dtype=np.float32)
    idx = rng.integers(0, 100, (128, 8)).astype(np.int32)
    want = np.zeros((100, width), np.float64)
    np.add.at(want, idx.reshape(-1), np.repeat(g, 8, axis=0))
    np.testing.assert_allclose(engine.f(g, idx), want, rtol=1e-5)


def test_a_kernel_without_parallel_loops_opens_no_region() -> None:
    text = "def f(float(N) A) -> (X) { X(i) = A(i) * 2.0 }"
    source = _source(text, "f", {"N": 64}, MappingOptions.cpu().replace(parallel=False))
    assert "#pragma omp" not in source.replace("#pragma omp simd", "")


# --- sharing the machine ------------------------------------------------------------------


def test_threads_busy_elsewhere_are_those_not_of_tcpy() -> None:
    """Of the runnable tasks, those of the calling thread and of tcpy's teams are
    tcpy's; another library's thread in this process (OpenBLAS's, spinning after its
    call) counts as busy, as a task of another process does."""
    assert threads.elsewhere(3, {10, 11, 12}, {10, 11}) == 1  # 12: another library's
    assert threads.elsewhere(5, {10, 11}, {10, 11, 13}) == 3  # three other processes
    assert threads.elsewhere(3, {10, 11, 12}, None) == 0  # teams unknown: all ours
    assert threads.elsewhere(1, {10, 11}, {10, 11}) == 0  # never below zero


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads /proc")
def test_the_threads_of_a_team_are_known() -> None:
    """After a call on two threads, tcpy knows its team's threads: tasks of this
    process, the calling thread among them."""
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(MATMUL)
    a = np.ones((64, 64), np.float32)
    engine.mm(a, a, options=MappingOptions.cpu().replace(threads=2))
    threads._TEAMS.know(2)
    alive = {int(t) for t in os.listdir("/proc/self/task")}
    team = threads._TEAMS.threads() & alive
    assert threading.get_native_id() in team and len(team) >= 2
    engine.mm(a, a, options=MappingOptions.cpu().replace(threads=3))  # a new team size
    threads._TEAMS.know(3)
    alive = {int(t) for t in os.listdir("/proc/self/task")}
    assert len(threads._TEAMS.threads() & alive) >= 3


def _placed(count: int) -> list[set[int]]:
    """The cores each other thread of the calling thread's team may run on after a
    call on `count` threads."""
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(MATMUL)
    a = np.ones((64, 64), np.float32)
    engine.mm(a, a, options=MappingOptions.cpu().replace(threads=count))
    others = threads._TEAMS.team() - {threading.get_native_id()}
    assert len(others) == count - 1
    return [os.sched_getaffinity(t) for t in others]


@pytest.mark.skipif(
    knobs.cores() < 2 or not threads._TEAMS.placing, reason="one core, or no affinity calls"
)
def test_a_team_with_a_core_for_each_thread_gets_one_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Woken at each call, a sleeping thread may be put on its waker's core and stay,
    the two taking turns: a team with a core for each thread puts each other thread
    on a core of its own, none on the caller's; a team larger than the cores lets
    them run anywhere again, and an environment that binds OpenMP's threads itself
    is left to do so."""
    for name, _ in knobs._BINDING:
        monkeypatch.delenv(name, raising=False)
    cores, allowed = knobs.cores(), os.sched_getaffinity(0)
    placed = _placed(cores)
    assert all(len(p) == 1 for p in placed)
    around = threads._TEAMS._placed[threading.get_native_id()]  # the caller's core then
    assert around in allowed and set.union(*placed) == allowed - {around}
    assert all(p == allowed for p in _placed(cores + 1))
    monkeypatch.setenv("OMP_PROC_BIND", "false")
    assert all(p == allowed for p in _placed(cores))


_SPINNING = """
import os, sys, time
import numpy as np
import tcpy
from tcpy.mapping.options import MappingOptions
from tcpy.runtime import threads
engine = tcpy.ExecutionEngine("cpu")
engine.define("def f(float(N) A) -> (B) { B(i) = A(i) + 1 }")
a = np.ones(1 << 16, np.float32)
engine.f(a, options=MappingOptions.cpu().replace(threads=2))  # loads libgomp
threads._TEAMS.know(2)
workers = threads._TEAMS.threads() - {threads.threading.get_native_id()}
engine.f(a, options=MappingOptions.cpu().replace(threads=2))
time.sleep(0.05)
states = []
for tid in workers:
    stat = open(f"/proc/self/task/{tid}/stat", "rb").read()
    states.append(stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3].decode())
print("".join(states), os.environ.get("GOMP_SPINCOUNT"))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads /proc")
@pytest.mark.parametrize("policy", [None, "active"])
def test_the_threads_sleep_soon_after_a_call(policy: str | None) -> None:
    """50 ms after a call, the team's other threads sleep (libgomp's default spins
    for milliseconds, during which another library's call finds the cores busy), and
    the environment is as it was; where the environment chose how OpenMP threads
    wait (`OMP_WAIT_POLICY=active`), tcpy keeps that choice: they still spin."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update({"OMP_WAIT_POLICY": policy} if policy else {})
    env.pop("TCPY_NUM_THREADS", None)
    done = subprocess.run(
        [sys.executable, "-c", _SPINNING], env=env, capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    states, spin = done.stdout.split()
    assert states and spin == "None"
    assert set(states) <= ({"R"} if policy == "active" else {"S"})


_MLP = """def mlp(float(B,K) I, float(N,K) W, float(N) bias) -> (O) {
    O(b, n) +=! I(b, k) * W(n, k)
    O(b, n) = fmax(O(b, n) + bias(n), 0)
}"""


@pytest.mark.parametrize("name", ["matmul", "softmax", "layernorm", "conv", "mlp"])
def test_results_are_the_same_bits_on_any_thread_count(name: str) -> None:
    """Each output element is computed the same way whatever thread runs it: the
    results of 1, 2, 3 and 5 threads are bit-identical (gradients rely on it)."""
    source, inputs = {
        "matmul": (MATMUL, [(67, 91), (91, 45)]),
        "softmax": (SOFTMAX, [(37, 300)]),
        "layernorm": (LAYERNORM, [(37, 300), (300,), (300,)]),
        "conv": (CONV, [(2, 5, 19, 17), (7, 5, 3, 3)]),
        "mlp": (_MLP, [(37, 129), (65, 129), (65,)]),
    }[name]
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(source)
    entry = re.search(r"def (\w+)", source).group(1)  # type: ignore[union-attr]
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in inputs]
    results = [
        engine.run(entry, *arrays, options=engine.default_options(entry).replace(threads=t))
        for t in (1, 2, 3, 5)
    ]
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


def test_beside_busy_threads_the_faster_count_is_kept() -> None:
    """Where other threads keep a core busy, a kernel at given sizes runs on the free
    cores and on all of them until each has `TRIALS` times, then on the faster by the
    median, trying the other again every `RETRY` calls, two calls in a row; calls not
    chosen so are not recorded, nor calls on more threads than the last (a warm-up)."""
    trials = threads.Trials()
    seconds = {1: 0.002, 2: 0.001}  # two threads faster in this state
    picks: list[int] = []
    for _ in range(2 * threads.Trials.TRIALS + 2 + 2 * threads.Trials.RETRY):
        count = trials.choose(1, 2, picks[-1] if picks else 1)
        picks.append(count)
        trials.record(seconds[count])
    tried = 2 * threads.Trials.TRIALS + 1  # the first call on 2 threads: not timed
    assert picks[:tried] == [1] * threads.Trials.TRIALS + [2] * (threads.Trials.TRIALS + 1)
    retries = "".join(map(str, picks[tried:]))
    assert retries.count("1") == 4 and retries.count("211") == 2  # twice two calls on 1
    trials.chosen = None  # a quiet call (`threads_now` clears the choice)
    trials.record(5.0)
    assert trials.choose(1, 2, 2) == 2


def test_a_switch_to_more_threads_is_not_what_the_count_costs() -> None:
    """The first call on all the cores after calls on fewer wakes threads that slept
    (slower, here by 5 ms) and is not recorded: after noisy first trials that put
    the kernel on the free core, the retries find all the cores faster again (timed
    with the switches, every retry was slow and the kernel stayed on one thread)."""
    trials = threads.Trials()
    noise = iter([0.0, 0.004, 0.004])  # the first calls on two threads, disturbed
    picks: list[int] = []
    for _ in range(6 * threads.Trials.RETRY):
        before = picks[-1] if picks else 1
        count = trials.choose(1, 2, before)
        picks.append(count)
        woken = 0.005 if count > before else 0.0
        trials.record((0.002 if count == 1 else 0.001 + next(noise, 0.0)) + woken)
    assert picks[-threads.Trials.RETRY :].count(2) >= threads.Trials.RETRY - 2


def test_a_count_fast_but_for_runs_of_slow_calls_is_kept() -> None:
    """Two threads right after another library's calls: fast (1.3 ms) but for runs of
    slow calls (6 ms, that library's thread still spinning), one thread steady at 2.6
    ms. The trials compare the least of their last times, so two threads are kept;
    a median of three would land in a run of slow calls and move to one thread."""
    trials = threads.Trials()
    slow = [False, True, True, False, False, False, False, False]  # a run of two in eight
    picks: list[int] = []
    twos = 0
    for _ in range(4 * threads.Trials.RETRY):
        count = trials.choose(1, 2, picks[-1] if picks else 1)
        picks.append(count)
        if count == 2:
            trials.record(0.006 if slow[twos % len(slow)] else 0.0013)
            twos += 1
        else:
            trials.record(0.0026)
    # the retries alone: calls 51, 100, 101, 150, 151 and 200, the trials before them
    assert picks[-3 * threads.Trials.RETRY :].count(1) == 6


def test_threads_now_consults_the_trials_only_beside_busy_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TCPY_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(knobs, "cores", lambda: 2)
    monkeypatch.setattr(threads, "_LOAD", threads.Load(interval=0, samples=1))
    trials = threads.Trials()
    monkeypatch.setattr(threads, "runnable_elsewhere", lambda: 0)
    assert threads.threads_now(0, None, trials) == 2 and trials.chosen is None
    monkeypatch.setattr(threads, "runnable_elsewhere", lambda: 1)
    assert threads.threads_now(0, None, trials) == 1 and trials.chosen == 1  # tried first
    assert threads.threads_now(0, None) == 1  # without trials: the free cores
