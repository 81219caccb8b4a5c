"""What differs between the C and the CUDA spelling of generated code, in one table."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from tcpy.types import ScalarType

_C_TYPES = {
    ScalarType.BOOL: "bool",
    ScalarType.UINT8: "uint8_t",
    ScalarType.UINT16: "uint16_t",
    ScalarType.UINT32: "uint32_t",
    ScalarType.UINT64: "uint64_t",
    ScalarType.INT8: "int8_t",
    ScalarType.INT16: "int16_t",
    ScalarType.INT32: "int32_t",
    ScalarType.INT64: "int64_t",
    ScalarType.FLOAT16: "uint16_t",  # their bits (`tcpy.codegen.halves`)
    ScalarType.BFLOAT16: "uint16_t",
    ScalarType.FLOAT32: "float",
    ScalarType.FLOAT64: "double",
}


_CUDA_TYPES = {
    ScalarType.BOOL: "bool",
    ScalarType.UINT8: "unsigned char",
    ScalarType.UINT16: "unsigned short",
    ScalarType.UINT32: "unsigned int",
    ScalarType.UINT64: "unsigned long long",
    ScalarType.INT8: "signed char",
    ScalarType.INT16: "short",
    ScalarType.INT32: "int",
    ScalarType.INT64: "long long",
    ScalarType.FLOAT16: "__half",  # 16-bit structs of `tcpy.codegen.halves`
    ScalarType.BFLOAT16: "__nv_bfloat16",
    ScalarType.FLOAT32: "float",
    ScalarType.FLOAT64: "double",
}


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    types: dict[ScalarType, str] = field(default_factory=lambda: dict(_C_TYPES))
    index_type: str = "int64_t"
    restrict: str = "restrict"
    function_prefix: str = "static inline"  # of the helper functions
    status_store: str = "__atomic_store_n(tc_status, {code}, __ATOMIC_RELAXED)"
    # an element of a tensor's buffer: read, written (an lvalue), read through the
    # read-only cache
    load: str = "{array}[{index}]"
    store: str = "{array}[{index}]"
    readonly_load: str = "{array}[{index}]"
    copy_load: str = "{array}[{index}]"  # an element of a local (CPU) or shared (GPU) copy
    copy_store: str = "{array}[{index}]"  # written (a temporary kept in shared memory)
    address: str = "&{array}[{index}]"  # an element's address (for an atomic)
    zero: str = "({ctype})0"  # a zero of a C type (C++'s value-initialisation in CUDA,
    # which the 16-bit structs of the half types take)

    def ctype(self, ty: ScalarType) -> str:
        return self.types[ty]


C = Dialect("c")

# CUDA source is self-contained (no includes): types are C++'s own, helpers are device
# functions, and an error status is recorded with an atomic exchange.
CUDA = Dialect(
    "cuda",
    types=dict(_CUDA_TYPES),
    index_type="long long",
    restrict="__restrict__",
    function_prefix="static __device__ __forceinline__",
    status_store="atomicExch(tc_status, {code})",
    load="TC_LD({array}, {index})",  # the access macros of `tcpy.codegen.cuda`
    store="TC_ST({array}, {index})",
    readonly_load="TC_LDG({array}, {index})",
    copy_load="TC_SLD({array}, {index})",
    copy_store="TC_SST({array}, {index})",
    address="TC_AT({array}, {index})",
    zero="{ctype}{{}}",
)
# CUDA whose index arithmetic is 32-bit (`int`): a kernel compiled for sizes at which
# every index fits (`tcpy.codegen.cuda.narrow_indices`). The GPU's integer units do a
# 32-bit multiply-add in one instruction and a 64-bit one in several.
CUDA_NARROW = dataclasses.replace(CUDA, name="cuda", index_type="int")
