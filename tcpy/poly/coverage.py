"""Which tensors a kernel writes whole before it reads them, so that their buffers need
no zero-fill at call time.

Outputs and temporaries start at zero (a `+=` without `!` adds to that zero), so the
runtime zero-fills their buffers unless the kernel is known to overwrite every element
before anything reads it. That holds for a tensor when the first statement to touch it,
in source order, writes it without reading it (`=`, or a `!` reduction, whose
initialisation runs first), and writes every element of its shape: its written set
contains the tensor's box for every size the scop allows. A `where` that narrows the
written range, a statement that reads the tensor it writes, or a first touch that is a
read all keep the zero-fill.
"""

from __future__ import annotations

import islpy as isl

from tcpy.naming import tensor_name
from tcpy.parser import ast
from tcpy.parser.checked import CheckedStatement, TensorInfo
from tcpy.poly.isl_helpers import read_set, sym_str
from tcpy.poly.scop import Kind, Scop


def written_before_read(scop: Scop) -> frozenset[str]:
    """The outputs and temporaries every element of which the kernel writes before
    reading it (TC names)."""
    cdef = scop.cdef
    whole = set()
    for tensor in (*cdef.outputs, *cdef.temporaries):
        first = next((k for k, st in enumerate(cdef.statements) if _touches(st, tensor.name)), None)
        if first is None:
            continue
        st = cdef.statements[first]
        overwrites = st.tensor == tensor.name and (st.op.initializes or not st.op.is_reduction)
        if overwrites and not _reads(st, tensor.name) and _covers(scop, first, tensor):
            whole.add(tensor.name)
    return frozenset(whole)


def _reads(st: CheckedStatement, name: str) -> bool:
    return any(
        isinstance(n, ast.Access) and n.tensor == name for e in st.expressions for n in ast.walk(e)
    )


def _touches(st: CheckedStatement, name: str) -> bool:
    return st.tensor == name or _reads(st, name)


def _covers(scop: Scop, index: int, tensor: TensorInfo) -> bool:
    """Whether the statement at `index` (its initialisation, for a `!` reduction)
    writes every element of `tensor`'s box, under the scop's context."""
    kind = Kind.INIT if scop.cdef.statements[index].op.initializes else Kind.COMPUTE
    (writer,) = [s for s in scop.statements if s.index == index and s.kind is kind]
    written = scop.writes.intersect_domain(isl.UnionSet.from_set(writer.domain)).range()
    dims = [f"_d{k}" for k in range(len(tensor.shape))]
    bounds = [f"0 <= {d} < {sym_str(e)}" for d, e in zip(dims, tensor.shape, strict=True)]
    body = f"{tensor_name(tensor.name)}[{', '.join(dims)}] : " + " and ".join(["true", *bounds])
    box = read_set(scop.ctx, scop.isl_params, body).intersect_params(scop.context)
    return isl.UnionSet.from_set(box).is_subset(written)
