"""The status words compiled kernels report: the contract between the code the printers
write and the runtimes that read it (`tcpy.runtime.status` turns a word into an error).
0 means all went well."""

from __future__ import annotations

STATUS_DIVISION_BY_ZERO = 1
STATUS_INDEX_OUT_OF_RANGE = 2
STATUS_OUT_OF_MEMORY = 3  # the buffers of packed tiles could not be allocated
