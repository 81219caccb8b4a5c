"""The targets an `ExecutionEngine` can run on, by name.

A target turns a checked definition, the shapes of a call and mapping options into a
`Kernel` (`tcpy.kernels`): something that computes the outputs of a binding, built
here or found in the disk cache. Targets share the front
end and the call-time checks; they differ in their mapping, printer and runtime.

- `reference`: the NumPy interpreter (no compilation).
- `cpu`: the polyhedral pipeline to C with OpenMP, built with the system compiler.
- `cuda-emu`: the pipeline mapped to CUDA blocks and threads; the CUDA source is built
  by the host C++ compiler with an emulation header and run on the CPU.
- `cuda`: the same CUDA source, compiled by NVRTC to a cubin and run on the GPU.
"""

from __future__ import annotations

import abc
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tcpy import cache, knobs, log
from tcpy.binding import Binding
from tcpy.cache import DiskCache, cache_key, enforce_cap
from tcpy.errors import TCError
from tcpy.host_kernels import EmulatedKernel, HostKernel
from tcpy.kernels import GpuKernels, Kernel, Launch, NoGpu, ReferenceKernel
from tcpy.mapping.gpu.device import DeviceProfile, default_profile, named
from tcpy.mapping.options import MappingOptions
from tcpy.parser.checked import CheckedDef
from tcpy.parser.printer import summary
from tcpy.poly.hoist import hoist_invariant_factors
from tcpy.poly.online import online_reductions
from tcpy.poly.scop import instances
from tcpy.poly.slices import sliced_operands
from tcpy.poly.widen import widen_half_reductions

if TYPE_CHECKING:
    from tcpy.poly.scop import Scop


@dataclass
class Stats:
    """What the engine's caches did: kernels found in memory, found on disk, built."""

    memory_hits: int = 0
    disk_hits: int = 0
    compiles: int = 0


@dataclass
class Session:
    """What a target may use while preparing kernels: the disk cache and the counters."""

    disk: DiskCache | None
    stats: Stats = field(default_factory=Stats)


class Target(abc.ABC):
    name: str = ""
    accepts_device_arrays = False
    generic_kernels = False
    """Whether options with `fix_parameters_before_scheduling=False` give a kernel
    that serves every shape of the same ranks and dtypes, reused across shapes."""

    def default_options(self, cdef: CheckedDef) -> MappingOptions:
        return MappingOptions()

    def device(self) -> str:
        """What the kernels run on (tuned options are kept per device)."""
        return "host"

    @abc.abstractmethod
    def prepare(
        self, cdef: CheckedDef, binding: Binding, options: MappingOptions, session: Session
    ) -> Kernel: ...


class Reference(Target):
    name = "reference"

    def prepare(
        self, cdef: CheckedDef, binding: Binding, options: MappingOptions, session: Session
    ) -> Kernel:
        return ReferenceKernel(cdef, summary(cdef), options)


class Cpu(Target):
    name = "cpu"
    generic_kernels = True

    def default_options(self, cdef: CheckedDef) -> MappingOptions:
        from tcpy.mapping.cpu import cpu_defaults

        return cpu_defaults(cdef)

    def device(self) -> str:
        from tcpy.runtime import cpu as runtime

        return runtime.device_identity()

    def prepare(
        self, cdef: CheckedDef, binding: Binding, options: MappingOptions, session: Session
    ) -> Kernel:
        cdef = widen_half_reductions(cdef, extrema=False)  # accumulated in float32
        cdef = hoist_invariant_factors(cdef)  # computed once, not per output
        cdef = online_reductions(cdef, options.online_tile)  # a row's chain read once
        kernel = self._prepare(cdef, binding, options, session, count_loops=False)
        return replace(kernel, counting=_once(
            lambda: self._prepare(cdef, binding, options, session, count_loops=True)
        ))  # fmt: skip

    def _prepare(
        self,
        cdef: CheckedDef,
        binding: Binding,
        options: MappingOptions,
        session: Session,
        count_loops: bool,
    ) -> HostKernel:
        from tcpy.pipeline import lower_to_c
        from tcpy.runtime import cpu as runtime

        # the thread count is chosen at each call: no kernel is built for one
        threads, options = options.threads, options.replace(threads=0)
        generic = not options.fix_parameters_before_scheduling

        def build(directory: Path) -> dict[str, Any]:
            lowered = lower_to_c(cdef, binding.sizes, options, count_loops=count_loops)
            (directory / "kernel.c").write_text(lowered.source)
            with log.stage("cc"):
                runtime.build(directory / "kernel.c", directory / "kernel.so")
            record = _write_record(directory, lowered.options, lowered.clock_forced, lowered.scop)
            if generic and lowered.options.fix_parameters_before_scheduling:
                record["cache"] = False  # fell back to these sizes: not for every shape
            return record

        def load(directory: Path) -> HostKernel:
            symbols = cdef.size_symbols
            kernel = runtime.CpuKernel(
                directory / "kernel.so",
                threads,
                lambda sizes: instances(cdef, dict(zip(symbols, sizes, strict=True))),
            )
            source = (directory / "kernel.c").read_text()
            built, written = _read_record(directory)
            return HostKernel(
                cdef, source, kernel, built.replace(threads=threads), written,
                generic=not built.fix_parameters_before_scheduling,
            )  # fmt: skip

        toolchain = runtime.compiler_identity() + (COUNTING if count_loops else "")
        return _compiled(
            self.name, cdef, binding, options, session, build,
            device=runtime.device_identity(), toolchain=toolchain, load=load, generic=generic,
        )  # fmt: skip


class CudaEmu(Target):
    """The CUDA source of the `cuda` target, run on the CPU by the emulator; with
    `check` (default: `TCPY_EMU_CHECK=1`), instrumented, every launch checked for
    out-of-bounds accesses, shared-memory races and divergent barriers."""

    name = "cuda-emu"

    def __init__(self, check: bool | None = None, device: str | None = None) -> None:
        self.check = check
        self.profile_name = device

    def profile(self) -> DeviceProfile:
        """The device mapped for: the one named here, else `TCPY_CUDA_DEVICE`'s, else
        H100's."""
        return named(self.profile_name) if self.profile_name else default_profile()

    def device(self) -> str:
        return f"emulated {self.profile().key()}"

    def default_options(self, cdef: CheckedDef) -> MappingOptions:
        from tcpy.mapping.gpu import cuda_defaults

        return cuda_defaults(cdef)

    def prepare(
        self, cdef: CheckedDef, binding: Binding, options: MappingOptions, session: Session
    ) -> Kernel:
        cdef = widen_half_reductions(cdef)  # the kernels accumulate in float32
        cdef = online_reductions(cdef, options.online_tile)  # a row's chain read once
        cdef = sliced_operands(cdef)  # its operands read apart, apart (GPU rows over tiles)
        check = knobs.emu_check() if self.check is None else self.check
        kernel = self._prepare(cdef, binding, options, session, instrumented=check)
        counting = _once(lambda: self._prepare(cdef, binding, options, session, False, True))
        if check:
            return replace(kernel, counting=counting)
        twin = _once(lambda: self._prepare(cdef, binding, options, session, instrumented=True))
        return replace(kernel, twin=twin, counting=counting)

    def _prepare(
        self,
        cdef: CheckedDef,
        binding: Binding,
        options: MappingOptions,
        session: Session,
        instrumented: bool,
        count_loops: bool = False,
    ) -> EmulatedKernel:
        from tcpy.codegen import one_kernel
        from tcpy.codegen.c import buffer_order
        from tcpy.codegen.cuda import kernel_parameters
        from tcpy.pipeline import lower_to_cuda
        from tcpy.runtime import emulator

        profile = self.profile()

        def build(directory: Path) -> dict[str, Any]:
            lowered = lower_to_cuda(
                cdef, binding.sizes, options, device=profile, count_loops=count_loops
            )
            (directory / "kernel.cu").write_text(lowered.source)
            params = kernel_parameters(lowered.scop)
            launches = lowered.launches
            if lowered.one_kernel:
                params = one_kernel.parameters(params)
                launches = [emulator.resident(launch) for launch in launches]
            launchers = "".join(
                emulator.launcher(k, params, len(cdef.size_symbols), lowered.source)
                for k in range(len(launches))
            )
            with log.stage("c++"):
                emulator.build(lowered.source, launchers, directory, instrumented)
            _write_launches(directory, launches)
            return _write_record(directory, lowered.options, lowered.clock_forced, lowered.scop)

        def load(directory: Path) -> EmulatedKernel:
            launches = _read_launches(directory)
            kernels = emulator.EmulatedKernels(
                directory / "kernel-emu.so", launches, buffer_order(cdef),
                kernels=[f"{cdef.name}#{k}" for k in range(len(launches))],
                instrumented=instrumented, check=instrumented,
            )  # fmt: skip
            source = (directory / "kernel.cu").read_text()
            return EmulatedKernel(cdef, source, kernels, *_read_record(directory))

        toolchain = emulator.compiler_identity(instrumented) + (COUNTING if count_loops else "")
        return _compiled(
            self.name, cdef, binding, options, session, build,
            device=self.device(), toolchain=toolchain, load=load,
        )  # fmt: skip


COUNTING = " count-loops"
"""Appended to the toolchain of a counting build's cache key (`Compiled.iterations`)."""

Built = TypeVar("Built")


def _once(make: Callable[[], Built]) -> Callable[[], Built]:
    """`make`, called at most once: the first call's result is kept."""
    return functools.cache(make)


# The files each target's kernel is loaded from: a cache entry holds exactly these.
_CACHED_FILES = {
    "cpu": ("kernel.c", "kernel.so", "built.json"),
    "cuda-emu": ("kernel.cu", "kernel-emu.so", "launches.json", "built.json"),
    "cuda": ("kernel.cu", "kernel.cubin", "launches.json", "built.json"),
}


def _write_record(
    directory: Path, built_with: MappingOptions, clock_forced: bool, scop: Scop
) -> dict[str, Any]:
    """Write `built.json`: the options the kernel was built with (after the compiler's
    fallbacks) and the tensors it writes whole before reading them. Returns the
    entry's metadata; a build whose fallback came from the clock is not cached, since a
    quieter machine may do better."""
    from tcpy.poly.coverage import written_before_read

    written = sorted(written_before_read(scop))
    record = {"options": built_with.to_dict(), "written": written}
    (directory / "built.json").write_text(json.dumps(record))
    return {"options": built_with.to_dict(), "cache": not clock_forced}


def _read_record(directory: Path) -> tuple[MappingOptions, frozenset[str]]:
    record = json.loads((directory / "built.json").read_text())
    return MappingOptions.from_dict(record["options"]), frozenset(record["written"])


Loaded = TypeVar("Loaded")


def _compiled(
    target: str,
    cdef: CheckedDef,
    binding: Binding,
    options: MappingOptions,
    session: Session,
    build: Callable[[Path], dict[str, Any]],
    device: str,
    toolchain: str,
    load: Callable[[Path], Loaded],
    generic: bool = False,
) -> Loaded:
    """The kernel of this compilation, made by `load(directory)` from its cache entry:
    found on disk (an entry that does not load is rebuilt once), or built by
    `build(directory)` (which writes the kernel's files) and published; without a usable
    disk cache, or when `build` says its result must not be cached, built in a private
    temporary directory that is removed once `load` has read it. A `generic` kernel is
    keyed by its inputs' ranks and dtypes, not their shapes."""
    signature = [(("*",) * a.ndim if generic else a.shape, a.dtype) for a in binding.arrays]
    key = cache_key(cdef, signature, options.to_json(), target, device, toolchain)

    def counted(directory: Path) -> dict[str, Any]:
        session.stats.compiles += 1
        inputs = [[list(shape), str(dtype)] for shape, dtype in signature]
        described = {"def": cdef.name, "target": target, "device": device, "inputs": inputs}
        return {**described, **build(directory)}

    loaded, hit = cache.compiled(session.disk, key, _CACHED_FILES[target], counted, load)
    session.stats.disk_hits += hit
    return replace(loaded, cache_key=key)  # type: ignore[type-var]


def _write_launches(directory: Path, launches: list[Launch], cooperative: bool = False) -> None:
    """The grid and block of every launch, in order (`launches.json`); a `cooperative`
    launch (a def's one kernel) has a seventh number, 1."""
    dims = [[*grid, *block, *([1] if cooperative else [])] for grid, block in launches]
    (directory / "launches.json").write_text(json.dumps(dims))


def _read_launches(directory: Path) -> list[Launch]:
    dims = json.loads((directory / "launches.json").read_text())
    return [((d[0], d[1], d[2]), (d[3], d[4], d[5])) for d in dims]


def _read_cooperative(directory: Path) -> bool:
    """Whether the launches of `launches.json` are a def's one kernel's."""
    dims = json.loads((directory / "launches.json").read_text())
    return any(d[6:] == [1] for d in dims)


class Cuda(Target):
    """The CUDA target: NVRTC to a cubin for the device, launched through the driver.
    `asynchronous` (the default): calls whose arrays all stay on the device do not
    wait for their kernels (`GpuKernels`); False: every call waits."""

    name = "cuda"
    accepts_device_arrays = True

    def __init__(self, asynchronous: bool = True) -> None:
        self.asynchronous = asynchronous

    def default_options(self, cdef: CheckedDef) -> MappingOptions:
        from tcpy.mapping.gpu import cuda_defaults

        return cuda_defaults(cdef)

    def device(self) -> str:
        profile, arch = self.profile()
        return f"{profile.key()} {arch}"

    def profile(self) -> tuple[DeviceProfile, str]:
        """The GPU's profile, read from the driver, and the architecture cubins are
        built for. Without a GPU: the profile `TCPY_CUDA_DEVICE` names (H100's by
        default), built for `TCPY_CUDA_ARCH` or else the profile's architecture."""
        from tcpy.runtime import cuda as runtime

        try:
            profile = runtime.device_profile(runtime.driver())
        except TCError:
            profile = default_profile()
            return profile, knobs.cuda_arch() or profile.arch
        return profile, profile.arch

    def prepare(
        self, cdef: CheckedDef, binding: Binding, options: MappingOptions, session: Session
    ) -> Kernel:
        cdef = widen_half_reductions(cdef)  # the kernels accumulate in float32
        cdef = online_reductions(cdef, options.online_tile)  # a row's chain read once
        cdef = sliced_operands(cdef)  # its operands read apart, apart (GPU rows over tiles)
        from tcpy.pipeline import lower_to_cuda
        from tcpy.runtime import cuda as runtime
        from tcpy.runtime import nvrtc

        try:
            drv: runtime.Driver | None = runtime.driver()
        except TCError:
            drv = None  # no GPU here: build the source and a cubin, refuse to run
        profile, arch = self.profile()

        def build(directory: Path) -> dict[str, Any]:
            lowered = lower_to_cuda(cdef, binding.sizes, options, device=profile)
            (directory / "kernel.cu").write_text(lowered.source)
            with log.stage("nvrtc"):
                cubin = nvrtc.compile_cubin(lowered.source, arch, exact=lowered.exact)
            (directory / "kernel.cubin").write_bytes(cubin)
            _write_launches(directory, lowered.launches, lowered.one_kernel)
            return _write_record(directory, lowered.options, lowered.clock_forced, lowered.scop)

        def load(directory: Path) -> Kernel:
            source = (directory / "kernel.cu").read_text()
            built_with, written = _read_record(directory)
            if drv is None:
                return NoGpu(source, built_with)
            launches = _read_launches(directory)
            cubin = (directory / "kernel.cubin").read_bytes()
            cooperative = _read_cooperative(directory)
            if cooperative:
                functions, launches = _cooperative(drv, cubin, launches)
            else:
                names = [f"tc_kernel_{k}" for k in range(len(launches))]
                functions = drv.load(cubin, names)
            return GpuKernels(
                cdef, source, functions, launches, built_with, written, self.asynchronous,
                cooperative=cooperative,
            )  # fmt: skip

        return _compiled(
            self.name, cdef, binding, options, session, build,
            device=f"{profile.key()} {arch}", toolchain=nvrtc.identity(), load=load,
        )  # fmt: skip


def _cooperative(drv: Any, cubin: bytes, launches: list[Launch]) -> tuple[list[Any], list[Launch]]:
    """The one kernel of a def, loaded for cooperative launches on the blocks the
    device holds at once."""
    from tcpy.runtime import cooperative

    if not drv.attribute("COOPERATIVE_LAUNCH"):
        raise TCError(
            "this GPU cannot launch kernels cooperatively, which the def's one kernel "
            "needs: compile it with one_kernel=False"
        )
    kernel = cooperative.CooperativeKernel(cubin, "tc_kernel_0")
    sms = drv.attribute("MULTIPROCESSOR_COUNT")
    return [kernel], [cooperative.fit(kernel, launch, sms) for launch in launches]


TARGETS: dict[str, Target] = {t.name: t for t in (Reference(), Cpu(), CudaEmu(), Cuda())}


def default_target() -> str:
    """`cuda` on a machine whose GPU the driver layer can use, `cpu` elsewhere."""
    if not Path("/dev/nvidia0").exists():  # cheap: no device node, no GPU
        return "cpu"
    from tcpy.runtime import cuda as runtime

    return "cuda" if runtime.has_gpu() else "cpu"


def get(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        known = ", ".join(sorted(TARGETS))
        raise TCError(f"unknown target {name!r}; the targets are: {known}") from None


def open_disk_cache() -> DiskCache | None:
    """The disk cache of `TCPY_CACHE_DIR`, capped by `TCPY_CACHE_MAX_MB`; None when it is
    off, or unusable (warned)."""
    root = knobs.cache_dir()
    cap = knobs.cache_max_bytes()  # read even when the cache is off: a typo is reported
    return DiskCache.open(root, cap, enforce_cap) if root is not None else None
