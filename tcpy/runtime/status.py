"""The status codes compiled kernels report, as the errors they become.

A compiled kernel only knows that a fault happened, not where: `explained` finds
where by running the call on the reference interpreter, which names the tensor, the
index values and the statement, as the `reference` target's errors do."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tcpy.errors import TCError, TCInputError, TCLaunchError

if TYPE_CHECKING:
    from tcpy.binding import Binding
    from tcpy.parser import CheckedDef

# The status word a kernel sets (0: all went well), shared with the code generators.
STATUS_DIVISION_BY_ZERO = 1
STATUS_INDEX_OUT_OF_RANGE = 2
STATUS_OUT_OF_MEMORY = 3  # the buffers of packed tiles could not be allocated

# The most statement instances `explained` interprets (a few seconds of NumPy at most);
# a larger call keeps the kernel's own message.
EXPLAIN_POINTS = 1 << 26


class KernelFault(TCInputError):
    """A compiled kernel reported that the input values made it fault."""


def check_status(status: int) -> None:
    if status == STATUS_DIVISION_BY_ZERO:
        raise KernelFault("an integer division by zero happened in the kernel")
    if status == STATUS_INDEX_OUT_OF_RANGE:
        raise KernelFault(
            "the kernel read a tensor at an index outside its extent (through a gather, "
            "a modulo or a guarded subscript); check the index inputs"
        )
    if status == STATUS_OUT_OF_MEMORY:
        raise TCLaunchError(
            "the kernel could not allocate the buffers of its packed tiles (out of memory); "
            "pack_operands=False runs without them"
        )
    if status != 0:
        raise TCLaunchError(f"the kernel returned the unknown status {status}")


def explained(cdef: CheckedDef, binding: Binding, fault: KernelFault) -> TCError:
    """The error the reference interpreter raises on the call that made a compiled
    kernel fault; the fault itself, with a hint, when the inputs are in GPU memory, the
    call is too large to interpret quickly, or the interpreter finds nothing."""
    from tcpy.binding import DeviceInput
    from tcpy.reference import interpreter

    points = sum(
        math.prod(max(hi - lo, 0) for lo, hi in binding.ranges(st).values())
        for st in cdef.statements
    )
    if points <= EXPLAIN_POINTS and not any(isinstance(a, DeviceInput) for a in binding.arrays):
        try:
            interpreter.run(cdef, binding)
        except TCError as e:
            return e
    return KernelFault(f"{fault}; the reference target names the index values")
