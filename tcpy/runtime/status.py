"""The status words compiled kernels report (`tcpy.codegen.status`), as the errors
they become. A compiled kernel only knows that a fault happened, not where:
`tcpy.compiled` asks the reference interpreter where (`explained`)."""

from __future__ import annotations

from tcpy.codegen.status import (
    STATUS_DIVISION_BY_ZERO,
    STATUS_INDEX_OUT_OF_RANGE,
    STATUS_OUT_OF_MEMORY,
)
from tcpy.errors import TCInputError, TCLaunchError


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
