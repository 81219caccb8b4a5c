"""Values a backward reads back from a quotient the forward returns, rather than
recompute (`recovered`).

A softmax's backward reads `e(n, d) = exp(X(n, d) - mx(n))`, a value the forward does
not return: recomputed, it costs an `exp` an element, most of a row-fused backward's
time (a 512 x 1024 softmax's: 365 -> 215 us on one core without it). But the forward
returns `Y(n, d) = e(n, d) / s(n)`, and `s` is saved (a reduction, `tcpy.autodiff.
saving`), so the backward takes `e(n, d) = Y(n, d) * s(n)`: one product, and a read of
`Y` instead of `X`. The rule: a point-wise value `v` whose right-hand side calls a
builtin other than the cheap ones (`CHEAP`), which a later statement divides by
something, writing a final output over `v`'s own indices and ranges, in `v`'s type:
`O(i) = v(i) / r` gives `v(i) = O(i) * r`. The backward writes no `v`: each read of
it takes the product in its place (`Writer.recompute`), a multiply where a load was
(the softmax's backward 113 -> 71 us on two cores).

Only a quotient: `O = v * r` would give `v = O / r`, which is not `v` where `r` is 0
(a mask). The value read back is the forward's quotient rounded and multiplied again:
within two roundings of the value recomputed, which the backward's tolerance (a
gradient's, against finite differences) covers. It is not `v` where the quotient was
not finite or underflowed (`r` zero, infinite or subnormal): the forward's output is
then infinite, NaN or zero there, and the gradient through it no number either (or
as near zero as `v` was).
"""

from __future__ import annotations

from collections.abc import Callable

from tcpy.autodiff import build as b
from tcpy.autodiff.versions import Version, Versions
from tcpy.parser import ast

CHEAP = frozenset(
    {"fabs", "fmax", "fmin", "fma", "fdim", "copysign", "ceil", "floor", "round", "trunc"}
)
"""The builtins that cost about what a product does: a value calling only these is
recomputed, as an arithmetic one is."""


def recovered(vs: Versions, s: int, at_hand: Callable[[Version], bool]) -> ast.Expr | None:
    """The value statement `s` writes, read back from a later quotient the forward
    returns (`O(i) * r` where `O(i) = v(i) / r`, see the module), where every value
    the divisor `r` reads is `at_hand` (an input, an output, a saved value); None where
    there is no such quotient, or recomputing costs little."""
    st, v = vs.cdef.statements[s], vs.written[s]
    if st.op is not ast.AssignOp.ASSIGN or vs.keeps[s] or st.scatter or st.reduction_indices:
        return None
    if not _costly(vs.rhs[s]):
        return None
    scalar = vs.tensor(v).scalar
    for t in range(s + 1, len(vs.written)):
        other, out, rhs = vs.cdef.statements[t], vs.written[t], vs.rhs[t]
        if not vs.is_final_output(out) or vs.keeps[t] or other.op is not ast.AssignOp.ASSIGN:
            continue
        if (other.indices, other.ranges) != (st.indices, st.ranges):
            continue
        if not (isinstance(rhs, ast.Binary) and rhs.op is ast.BinaryOp.DIV):
            continue
        if not b.reads_at(rhs.lhs, v.name, st.indices):
            continue
        divisor = [vs.of[n.tensor] for n in ast.walk(rhs.rhs) if isinstance(n, ast.Access)]
        if not all(at_hand(r) for r in divisor):
            continue
        if not (vs.tensor(out).scalar is scalar is rhs.ty is rhs.lhs.ty):
            continue
        here = tuple(ast.Index(i, st.span) for i in st.indices)
        quotient = ast.Access(out.name, here, st.span, scalar)
        return b.mul(quotient, rhs.rhs)
    return None


def _costly(e: ast.Expr) -> bool:
    return any(isinstance(n, ast.Call) and n.name not in CHEAP for n in ast.walk(e))
