"""What a backward takes from the forward rather than recompute (`Save`, `savable`).

A value the backward reads that the forward computed by a reduction
(`mean(n) +=! X(n, d) / D`, a matrix product) costs a pass over its operands to
recompute and only its own elements to save, so `save="auto"` takes each such value as
an input of the backward, after the forward's outputs it reads; point-wise values are
recomputed from their operands, which the backward reads anyway. A maximum or minimum
is saved only where it reduces a plain read (`mx(n) max=! X(n, d)`): its ties are found
by comparing for equality, and a value recomputed by the backward's kernel may round
otherwise than the forward's. `tcpy.autodiff.derive.forward_saving` gives the forward
that returns the saved values beside its outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

from tcpy.autodiff.versions import Versions
from tcpy.errors import TCGradientError
from tcpy.parser import ast
from tcpy.parser.checked import CheckedDef

Save = str | Sequence[str] | None
"""What a backward takes as inputs instead of recomputing: None (or `"none"`):
nothing, it recomputes every value it reads; `"auto"`: the values computed by a
reduction (see the module); `"all"`: every value it reads; or the names of the values
to save (a temporary, or a version `O_1` of a tensor written several times, as the
backward names it)."""


def savable(cdef: CheckedDef, versions: Versions, save: Save) -> set[str]:
    """The versions of `cdef` that a backward takes as inputs where it reads them, by
    `save`; a `TCGradientError` for a `save` that names no such version."""
    vs = versions
    if save is None or save == "none":
        return set()
    if save == "auto":
        out = set()
        for s, st in enumerate(cdef.statements):
            w = vs.written[s]
            if vs.is_final_output(w) or st.scatter or len(st.ranges) == len(st.indices):
                continue  # an output, a scatter, or point-wise
            extremum = st.op.reduction in (ast.Reduction.MAX, ast.Reduction.MIN)
            if not extremum or isinstance(vs.rhs[s], ast.Access):
                out.add(w.name)
        return out
    written = {w.name for w in vs.written if not vs.is_final_output(w)}
    if save == "all":
        return written
    if isinstance(save, str):
        raise TCGradientError(
            f'save is "auto", "all", "none" or a list of names, not {save!r}', cdef.span
        )
    for n in save:
        if n not in written:
            what = "an output" if n in {t.name for t in cdef.outputs} else "not a value"
            known = ", ".join(sorted(written)) or "none"
            raise TCGradientError(
                f"save names {n!r}, {what} that {cdef.name} computes and a backward "
                f"could take (its temporaries and versions: {known})",
                cdef.span,
            )
    return set(save)
