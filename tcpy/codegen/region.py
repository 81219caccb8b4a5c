"""The kernel's one OpenMP parallel region: every nest of a kernel with parallel loops
runs inside one `#pragma omp parallel` of `tc_threads` threads (chosen at each call),
so threads are started once per call, not once per nest, and wait for each other only
where a nest needs what an earlier one wrote.

They wait at tcpy's own barrier (`BARRIER_C`), not OpenMP's: it spins for about as
long as libgomp's barriers did (0.1 ms) before it sleeps, while libgomp's own wait,
which a process sets once for every wait (`openmp.SPIN_COUNT`), is kept short, so that
the team's threads stop spinning as soon as a call ends and another library's call
finds its cores free. Every construct is `nowait`; the region ends at this barrier,
so that its threads reach OpenMP's closing one together.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from tcpy.codegen.isl_exprs import isl_expr
from tcpy.codegen.loops import FOR, IF, loop_depth, user_statements, walk
from tcpy.codegen.pack import print_pack
from tcpy.codegen.printer import Printer
from tcpy.codegen.register_block import UnprintedBlock
from tcpy.mapping.marks import Mark, Pack, Parallel, RegisterBlock, loop_marks, of_ast
from tcpy.parser import ast as tc
from tcpy.poly.isl_helpers import ast_children

SPINS = 10_000
"""How many times a thread checks the barrier, pausing between checks, before it sleeps:
about 0.1 ms here, as libgomp's barriers waited when a process set their wait."""

FEW_SPINS = 100
"""The same, where the team has more threads than the processors: a thread it waits
for may not be running, and spinning would keep it from its core."""

SHARING = " schedule(guided) nowait"
"""How a worksharing loop shares out its iterations: in chunks a thread takes when it
is ready, each half of what is left per thread. A thread woken at the call
(`openmp.SPIN_COUNT`) may start tens of microseconds after the calling thread, and a
core of a shared machine may run slower than the other; shared out in equal parts
(OpenMP's `static`), the others wait for it at the next barrier. Timed alternately
on the same buffers on 2 cores, guided against static: gesummv 0.16-0.17 ms against
0.23-0.26, atax 0.44-0.56 against 0.64, layernorm 0.49-0.50 against 0.54-0.60,
conv2d 1.35-1.53 against 1.63, matmul and bias_add_grad within the noise; `dynamic`
(one iteration at a time) lost on the row kernels (softmax 1.70 against 1.29). The
threads compute each iteration the same way, so results do not depend on which
thread takes it."""

WAIT = "tc_barrier(&tc_team_barrier, tc_team, tc_spins);"
"""Where the threads of the region wait for each other."""

BARRIER_C = r"""#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define TC_FUTEX_WAIT 128 /* FUTEX_WAIT | FUTEX_PRIVATE_FLAG */
#define TC_FUTEX_WAKE 129 /* FUTEX_WAKE | FUTEX_PRIVATE_FLAG */
#else
#include <sched.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#define tc_pause() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define tc_pause() __asm__ __volatile__("yield")
#else
#define tc_pause() ((void)0)
#endif
int omp_get_num_threads(void);
int omp_get_num_procs(void);
typedef struct { unsigned arrived, phase, sleeping; } tc_barrier_t;
/* the team's `team` threads wait here for each other: the last to arrive starts the
   next phase; the others check for it `spins` times, then sleep until it comes */
static void tc_barrier(tc_barrier_t *b, int team, int spins) {
  if (team <= 1) return;
  const unsigned phase = __atomic_load_n(&b->phase, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&b->arrived, 1, __ATOMIC_ACQ_REL) == (unsigned)team) {
    __atomic_store_n(&b->arrived, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&b->phase, phase + 1, __ATOMIC_SEQ_CST);
#if defined(__linux__)
    if (__atomic_exchange_n(&b->sleeping, 0, __ATOMIC_SEQ_CST))
      syscall(SYS_futex, &b->phase, TC_FUTEX_WAKE, team, NULL, NULL, 0);
#endif
    return;
  }
  for (int i = 0; __atomic_load_n(&b->phase, __ATOMIC_ACQUIRE) == phase; i++) {
    if (i < spins) {
      tc_pause();
      continue;
    }
#if defined(__linux__)
    __atomic_store_n(&b->sleeping, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &b->phase, TC_FUTEX_WAIT, phase, NULL, NULL, 0);
#else
    sched_yield();
#endif
  }
}
"""
"""The barrier of a kernel's region (`WAIT`), with what it needs (the futex operations
by their values, which need no kernel headers). A sleeper marks the barrier
(`sleeping`) before it sleeps on the phase, and the futex sleeps only while the phase
is the one it saw: whichever of the last arrival and a sleeper comes second sees the
other's write, so no sleeper is left behind."""


def print_region(p: Printer, depth: int, private: tuple[str, ...] = ()) -> None:
    """The nests inside one `omp parallel` region of `tc_threads` threads (read at
    call time): a nest's parallel loop is a worksharing loop, the loops around it
    run in every thread (their bounds depend only on the sizes and on outer loops),
    and code outside any parallel loop runs in one thread (`omp single`). Inside a
    nest every construct ends at a barrier; between nests there is one only where
    a nest touches a tensor that an earlier nest since the last barrier writes, or
    writes one that it reads. `private` are declarations made in every thread."""
    p.emit(depth, "tc_barrier_t tc_team_barrier = {0, 0, 0};")
    spins = f"tc_threads > omp_get_num_procs() ? {FEW_SPINS} : {SPINS}"
    p.emit(depth, f"const int tc_spins = {spins};")
    p.emit(depth, "#pragma omp parallel num_threads(tc_threads)")
    p.emit(depth, "{")
    p.emit(depth + 1, "const int tc_team = omp_get_num_threads();")
    for line in private:
        p.emit(depth + 1, line)
    unordered: list[_Touches] = []
    for nest in p.nests():
        touches = _touches(p, nest)
        if any(touches.conflicts(t) for t in unordered):
            p.emit(depth + 1, WAIT)
            unordered = []
        unordered.append(touches)
        for comment in p.comments(nest):
            p.emit(depth + 1, comment)
        _replicated(p, nest, depth + 1, (), wait=False)
    p.emit(depth + 1, WAIT)
    p.emit(depth, "}")


def _replicated(
    p: Printer, node: isl.AstNode, depth: int, marks: tuple[Mark, ...], wait: bool
) -> None:
    """`node`, run by every thread of the region: its parallel loop shared among
    them, the rest of its code in one of them; `wait`: the threads wait for each
    other after its last construct (not at the end of a nest)."""
    kind = node.get_type()
    if not has_parallel_loop(p, node, marks):
        p.emit(depth, "#pragma omp single nowait")
        p.emit(depth, "{")
        p.node(node, depth + 1, marks)
        p.emit(depth, "}")
    elif kind == FOR:
        if _parallel(node, marks):
            p.for_(node, depth, marks, shared=SHARING)
        else:
            p.open_loop(depth, p.loop_header(node).text)
            _replicated(p, node.for_get_body(), depth + 1, marks, wait=True)
            p.emit(depth, "}")
            return
    elif kind == isl.ast_node_type.block:
        children = list(ast_children(node))
        for k, child in enumerate(children):
            _replicated(p, child, depth, marks, wait or k < len(children) - 1)
        return
    elif kind == IF:
        p.emit(depth, f"if ({isl_expr(node.if_get_cond(), p.names, top=True)}) {{")
        _replicated(p, node.if_get_then_node(), depth + 1, marks, wait)
        if node.if_has_else_node():
            p.emit(depth, "} else {")
            _replicated(p, node.if_get_else_node(), depth + 1, marks, wait)
        p.emit(depth, "}")
        return
    else:  # a mark (a register block with a parallel loop inside is not blocked)
        mark = _mark(node)
        if isinstance(mark, Pack) and mark.once and p.ast.packed(node):
            # a copy made once above the nest: shared out, then read by every thread
            key = node.get_annotation().get_name()

            def body(inner: isl.AstNode, at: int, above: tuple[Mark, ...]) -> None:
                _replicated(p, inner, at, above, wait)

            print_pack(
                p, p.ast.packed(node), node.mark_get_node(), depth, marks, True, key, body, WAIT
            )
            return
        if isinstance(mark, RegisterBlock) and mark.fresh:  # its outputs never loaded
            raise UnprintedBlock(f"register block {mark.name} has a parallel loop inside")
        _replicated(p, node.mark_get_node(), depth, (*marks, _mark(node)), wait)
        return
    if wait:
        p.emit(depth, WAIT)


def has_parallel_loop(p: Printer, node: isl.AstNode, marks: tuple[Mark, ...]) -> bool:
    """Whether `node` has a loop that the marks above it make parallel."""
    return any(n.get_type() == FOR and _parallel(n, above) for n, above in walk(node, marks))


def _touches(p: Printer, nest: isl.AstNode) -> _Touches:
    """The tensors the statements of `nest` read and write."""
    reads: set[str] = set()
    writes: set[str] = set()
    for name in user_statements(nest, p.ast):
        source = p.scop.statement(name).source(p.scop.cdef)
        writes.add(source.tensor)
        reads.add(source.tensor)  # a reduction reads what it updates
        reads.update(n.tensor for n in tc.walk(source.rhs) if isinstance(n, tc.Access))
    return _Touches(frozenset(reads), frozenset(writes))


@dataclass(frozen=True)
class _Touches:
    """The tensors a nest reads and writes."""

    reads: frozenset[str]
    writes: frozenset[str]

    def conflicts(self, earlier: _Touches) -> bool:
        """Whether this nest must wait for `earlier` to finish."""
        return bool(earlier.writes & (self.reads | self.writes) or earlier.reads & self.writes)


def _parallel(loop: isl.AstNode, marks: tuple[Mark, ...]) -> bool:
    """Whether the marks above make `loop` the worksharing loop of its nest."""
    return any(isinstance(m, Parallel) for m in loop_marks(marks, loop_depth(loop)))


def _mark(node: isl.AstNode) -> Mark:
    mark = of_ast(node)
    assert mark is not None
    return mark
