"""The status codes compiled kernels report, as the errors they become."""

from __future__ import annotations

from tcpy.codegen.exprs import (
    STATUS_DIVISION_BY_ZERO,
    STATUS_INDEX_OUT_OF_RANGE,
    STATUS_OUT_OF_MEMORY,
)
from tcpy.errors import TCInputError, TCLaunchError


def check_status(status: int) -> None:
    if status == STATUS_DIVISION_BY_ZERO:
        raise TCInputError("an integer division by zero happened in the kernel")
    if status == STATUS_INDEX_OUT_OF_RANGE:
        raise TCInputError(
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
