"""The device profile: the facts about a GPU that the CUDA mapping decides with.

One frozen `DeviceProfile` per device: its compute capability, how many SMs it has
(the grid is sized to fill them several times over), how many threads a block and an
SM may hold, and the shared memory and registers a block and an SM may use. The
`cuda` target reads the profile of the GPU it runs on from the driver
(`tcpy.runtime.cuda`); `cuda-emu` runs the source `cuda` would generate for a named
profile: `h100` unless `TCPY_CUDA_DEVICE` or `ExecutionEngine(device=...)` chooses
another. A profile is part of every CUDA cache key (`key`), so kernels mapped for one
device are never reused for another.

The named profiles hold the vendor's published limits (CUDA C Programming Guide,
"Compute capabilities"; the whitepapers of each GPU for the SM counts).
"""

from __future__ import annotations

from dataclasses import dataclass

from tcpy import knobs
from tcpy.errors import TCError
from tcpy.mapping.options import MappingOptions
from tcpy.types import ScalarType

WARP = 32
SHUFFLED = tuple(
    ScalarType(t) for t in ("float32", "float64", "int32", "int64", "uint32", "uint64")
)
"""Compute types a warp shuffle moves."""
STATIC_SHARED = 48 * 1024
"""The most shared memory a block may declare statically (more must be dynamic and
opted into at launch, on every device since sm_70)."""


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    name: str
    arch: str  # "sm_90"
    sms: int  # streaming multiprocessors
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    shared_per_block: int  # bytes a block may use, opted in (dynamic shared memory)
    shared_per_sm: int  # bytes
    registers_per_block: int
    registers_per_sm: int
    l2_bytes: int  # the L2 cache (not read by the mapping: the emulator's DRAM model)

    @property
    def resident_threads(self) -> int:
        """The threads the whole device keeps resident at once."""
        return self.sms * self.max_threads_per_sm

    def key(self) -> str:
        """What cache keys hold of the profile: every fact the mapping reads."""
        return (
            f"{self.name} {self.arch} sms={self.sms} threads={self.max_threads_per_block}/"
            f"{self.max_threads_per_sm} blocks={self.max_blocks_per_sm} "
            f"shared={self.shared_per_block}/{self.shared_per_sm} "
            f"registers={self.registers_per_block}/{self.registers_per_sm}"
        )


_MIB = 1024 * 1024
PROFILES: dict[str, DeviceProfile] = {
    p.name: p
    for p in (
        # H100 SXM5 and H200 (GH100, 132 SMs enabled, 50 MB of L2), compute capability 9.0
        DeviceProfile(
            "h100", "sm_90", 132, 1024, 2048, 32, 227 * 1024, 228 * 1024, 65536, 65536, _MIB * 50
        ),
        DeviceProfile(
            "h200", "sm_90", 132, 1024, 2048, 32, 227 * 1024, 228 * 1024, 65536, 65536, _MIB * 50
        ),
        # A100 SXM4 (GA100, 108 SMs enabled, 40 MB of L2), compute capability 8.0
        DeviceProfile(
            "a100", "sm_80", 108, 1024, 2048, 32, 163 * 1024, 164 * 1024, 65536, 65536, _MIB * 40
        ),
        # L4 (AD104, 58 SMs, 48 MB of L2), compute capability 8.9
        DeviceProfile(
            "l4", "sm_89", 58, 1024, 1536, 24, 99 * 1024, 100 * 1024, 65536, 65536, _MIB * 48
        ),
    )
}
DEFAULT = "h100"


def named(name: str) -> DeviceProfile:
    """The named profile; a TCError listing the names for an unknown one."""
    try:
        return PROFILES[name.lower()]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise TCError(f"unknown device profile {name!r}; the profiles are: {known}") from None


def default_profile() -> DeviceProfile:
    """The profile `TCPY_CUDA_DEVICE` names, else `DEFAULT`'s."""
    return named(knobs.cuda_device() or DEFAULT)


def shared_budget(options: MappingOptions, device: DeviceProfile) -> int:
    """The bytes of boxes a block may place in its (static) shared memory, before
    padding (which adds a word to rows of 16 words or more: at most 1/17)."""
    limit = min(options.max_shared_memory or STATIC_SHARED, STATIC_SHARED, device.shared_per_block)
    return limit * 16 // 17
