"""The targets an `ExecutionEngine` can run on, by name.

A target turns a checked definition, the shapes of a call and mapping options into a
`Kernel`: something that computes the outputs of a binding. Targets share the front
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
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import numpy as np

from tcpy import cache, knobs, log
from tcpy.binding import Binding, empty_at
from tcpy.cache import DiskCache, cache_key
from tcpy.errors import TCError
from tcpy.mapping.device import DeviceProfile, default_profile, named
from tcpy.mapping.options import MappingOptions
from tcpy.parser.checked import CheckedDef, Role, TensorInfo
from tcpy.parser.printer import summary
from tcpy.reference import interpreter
from tcpy.runtime.empty import EmptyCall

if TYPE_CHECKING:
    from tcpy.poly.scop import Scop


# The destinations of `out=`, one per output, or None: new arrays.
Outputs = tuple[Any, ...] | None


class Kernel(Protocol):
    @property
    def source(self) -> str: ...

    @property
    def options(self) -> MappingOptions:
        """The options the kernel was built with: those asked for, as any fallback of
        the compiler changed them."""
        ...

    @property
    def generic(self) -> bool:
        """Whether the kernel serves every shape of its inputs' ranks and dtypes (the
        sizes are read at each call), not only the shapes it was built for."""
        ...

    @property
    def cache_key(self) -> str:
        """The key of the kernel's disk-cache entry ("" for the reference target)."""
        ...

    def __call__(self, binding: Binding, out: Outputs = None) -> tuple[Any, ...]:
        """The outputs of the call: new arrays, or the destinations `out` (checked
        by `tcpy.binding.bind_out`, on the side the kernel runs on, and sharing no
        memory with the inputs), filled."""
        ...


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


@dataclass(frozen=True)
class ReferenceKernel:
    cdef: CheckedDef
    source: str
    options: MappingOptions
    generic: bool = False
    cache_key: str = ""

    def __call__(self, binding: Binding, out: Outputs = None) -> tuple[Any, ...]:
        results = interpreter.run(self.cdef, binding)
        if out is None:
            return results
        for dest, result in zip(out, results, strict=True):
            np.copyto(dest, result)
        return out


@dataclass(frozen=True)
class HostKernel:
    """Compiled code that runs on the host (C, or emulated CUDA): `run(sizes, buffers)`
    fills the outputs and temporaries.

    Buffers start at zero, except those of the tensors the kernel writes whole before
    reading them (`written`, from `tcpy.poly.coverage`), which are not filled: with
    `TCPY_POISON=1` (the tests, the fuzzer) they are filled with all-ones bytes instead
    (NaN, -1), so that an element the kernel failed to write shows. Outputs are new
    arrays on every call (they are the caller's); temporaries are allocated once per
    thread (calls may run in several threads at once) and kept while their shapes
    hold. A `generic` kernel reads the sizes at each call and serves every shape (see
    `Target.generic_kernels`)."""

    cdef: CheckedDef
    source: str
    run: Callable[[list[int], list[np.ndarray]], None]
    options: MappingOptions
    written: frozenset[str] = frozenset()
    generic: bool = False
    cache_key: str = ""
    _scratch: threading.local = field(
        default_factory=threading.local, init=False, compare=False, repr=False
    )
    # the shapes of the outputs and temporaries, by the values of the sizes (None: empty)
    _shapes: dict[tuple[int, ...], list[tuple[int, ...]] | None] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def __call__(self, binding: Binding, out: Outputs = None) -> tuple[Any, ...]:
        shapes = self._shapes_at(binding)
        if shapes is None:
            # only an unchecked call of a generic kernel gets here at sizes where a range
            # is empty; the kernel was built for non-empty ranges (`tcpy.poly.scop`)
            return EmptyCall(self.cdef, self.options)(binding, out)
        sizes, buffers, outputs = self._buffers(binding, shapes, out)
        self.run(sizes, buffers)
        return outputs

    def _shapes_at(self, binding: Binding) -> list[tuple[int, ...]] | None:
        """The shapes of the outputs and temporaries at the call's sizes; None where the
        call is empty (`tcpy.binding.empty_at`)."""
        key = tuple(binding.sizes[s] for s in self.cdef.size_symbols)
        try:
            return self._shapes[key]
        except KeyError:
            pass
        if len(self._shapes) >= 256:
            self._shapes.clear()
        cdef = self.cdef
        shapes = None
        if not empty_at(cdef, binding.sizes):
            shapes = [binding.shape_of(t) for t in (*cdef.outputs, *cdef.temporaries)]
        self._shapes[key] = shapes
        return shapes

    def _buffers(
        self, binding: Binding, shapes: list[tuple[int, ...]], out: Outputs = None
    ) -> tuple[list[int], list[np.ndarray], tuple[np.ndarray, ...]]:
        """The sizes and buffers of a call, and its outputs (among the buffers)."""
        cdef = self.cdef
        sizes = [binding.sizes[s] for s in cdef.size_symbols]
        poison = knobs.poison_buffers()
        count = len(cdef.outputs)
        if out is None and not poison:  # the common case, kept lean
            outputs = tuple(
                np.empty(shape, dtype) if written else np.zeros(shape, dtype)
                for shape, (dtype, written) in zip(shapes, self._kinds, strict=False)
            )
        else:
            dests = out or (None,) * count
            outputs = tuple(
                self._output(t, shape, d, poison)
                for t, shape, d in zip(cdef.outputs, shapes, dests, strict=False)
            )
        temporaries = self._temporaries(shapes[count:], poison)
        return sizes, [*binding.host_arrays, *outputs, *temporaries], outputs

    @functools.cached_property
    def _kinds(self) -> tuple[tuple[np.dtype[Any], bool], ...]:
        """Each output's dtype, and whether the kernel writes it whole."""
        return tuple((t.scalar.dtype, t.name in self.written) for t in self.cdef.outputs)

    def _output(
        self, tensor: TensorInfo, shape: tuple[int, ...], dest: np.ndarray | None, poison: bool
    ) -> np.ndarray:
        written = tensor.name in self.written
        if dest is not None:
            if not written:
                dest.fill(0)
            elif poison:
                dest.reshape(-1).view(np.uint8).fill(0xFF)
            return dest
        dtype = tensor.scalar.dtype
        if not written:
            return np.zeros(shape, dtype)
        if poison:
            return _poisoned(shape, dtype)
        return np.empty(shape, dtype)

    def _temporaries(self, shapes: list[tuple[int, ...]], poison: bool) -> list[np.ndarray]:
        temporaries = self.cdef.temporaries
        if not temporaries:
            return []
        kept: list[np.ndarray] | None = getattr(self._scratch, "buffers", None)
        if kept is None or [b.shape for b in kept] != shapes:
            kept = [np.empty(s, t.scalar.dtype) for s, t in zip(shapes, temporaries, strict=True)]
            self._scratch.buffers = kept
        for tensor, buffer in zip(temporaries, kept, strict=True):
            if tensor.name not in self.written:
                buffer.fill(0)
            elif poison:
                buffer.reshape(-1).view(np.uint8).fill(0xFF)
        return kept


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
        from tcpy.pipeline import lower_to_c
        from tcpy.runtime import cpu as runtime

        # the thread count is chosen at each call: no kernel is built for one
        threads, options = options.threads, options.replace(threads=0)
        generic = not options.fix_parameters_before_scheduling

        def build(directory: Path) -> dict[str, Any]:
            lowered = lower_to_c(cdef, binding.sizes, options)
            (directory / "kernel.c").write_text(lowered.source)
            with log.stage("cc"):
                runtime.build(directory / "kernel.c", directory / "kernel.so")
            record = _write_record(directory, lowered.options, lowered.clock_forced, lowered.scop)
            if generic and lowered.options.fix_parameters_before_scheduling:
                record["cache"] = False  # fell back to these sizes: not for every shape
            return record

        def load(directory: Path) -> Kernel:
            kernel = runtime.CpuKernel(directory / "kernel.so", threads)
            source = (directory / "kernel.c").read_text()
            built, written = _read_record(directory)
            return HostKernel(
                cdef, source, kernel, built.replace(threads=threads), written,
                generic=not built.fix_parameters_before_scheduling,
            )  # fmt: skip

        return _compiled(
            self.name, cdef, binding, options, session, build,
            device=runtime.device_identity(), toolchain=runtime.compiler_identity(), load=load,
            generic=generic,
        )  # fmt: skip


@dataclass(frozen=True)
class EmulatedKernel(HostKernel):
    """CUDA kernels run by the emulator. `profile` counts their memory traffic, with
    the instrumented build (`twin` gives it when this one is not)."""

    twin: Callable[[], EmulatedKernel] | None = field(default=None, compare=False, repr=False)

    def profile(self, binding: Binding) -> list[dict[str, Any]]:
        from tcpy.runtime.emulator import EmulatedKernels

        run = self.run
        assert isinstance(run, EmulatedKernels)
        if not run.instrumented:
            assert self.twin is not None
            return self.twin().profile(binding)
        shapes = self._shapes_at(binding)
        if shapes is None:  # an empty call launches nothing
            return []
        sizes, buffers, _ = self._buffers(binding, shapes)
        return run.profile(sizes, buffers)


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
        check = knobs.emu_check() if self.check is None else self.check
        kernel = self._prepare(cdef, binding, options, session, instrumented=check)
        if check:
            return kernel
        return replace(
            kernel, twin=lambda: self._prepare(cdef, binding, options, session, instrumented=True)
        )

    def _prepare(
        self,
        cdef: CheckedDef,
        binding: Binding,
        options: MappingOptions,
        session: Session,
        instrumented: bool,
    ) -> EmulatedKernel:
        from tcpy.codegen.c import buffer_order
        from tcpy.codegen.cuda import kernel_parameters
        from tcpy.pipeline import lower_to_cuda
        from tcpy.runtime import emulator

        profile = self.profile()

        def build(directory: Path) -> dict[str, Any]:
            lowered = lower_to_cuda(cdef, binding.sizes, options, device=profile)
            (directory / "kernel.cu").write_text(lowered.source)
            params = kernel_parameters(lowered.scop)
            launchers = "".join(
                emulator.launcher(k.index, params, len(cdef.size_symbols), lowered.source)
                for k in lowered.mapping.kernels
            )
            with log.stage("c++"):
                emulator.build(lowered.source, launchers, directory, instrumented)
            _write_launches(directory, lowered.mapping)
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

        return _compiled(
            self.name, cdef, binding, options, session, build,
            device=self.device(), toolchain=emulator.compiler_identity(instrumented), load=load,
        )  # fmt: skip


# The files each target's kernel is loaded from: a cache entry holds exactly these.
_CACHED_FILES = {
    "cpu": ("kernel.c", "kernel.so", "built.json"),
    "cuda-emu": ("kernel.cu", "kernel-emu.so", "launches.json", "built.json"),
    "cuda": ("kernel.cu", "kernel.cubin", "launches.json", "built.json"),
}


def _poisoned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A buffer of all-ones bytes: NaN for floats, -1 for integers."""
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return np.full(size, 0xFF, np.uint8).view(dtype).reshape(shape)


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


Launch = tuple[tuple[int, int, int], tuple[int, int, int]]


def _write_launches(directory: Path, mapping: Any) -> None:
    """The grid and block of every kernel, in launch order (`launches.json`)."""
    dims = [[*grid, *block] for grid, block in (k.launch_dims() for k in mapping.kernels)]
    (directory / "launches.json").write_text(json.dumps(dims))


def _read_launches(directory: Path) -> list[Launch]:
    dims = json.loads((directory / "launches.json").read_text())
    return [((d[0], d[1], d[2]), (d[3], d[4], d[5])) for d in dims]


@dataclass(frozen=True)
class GpuKernels:
    """Compiled CUDA kernels of one definition on the GPU. NumPy inputs are copied to
    the device and the outputs back; device inputs are used in place, and the outputs
    then stay on the device (`DeviceArray`, which PyTorch and CuPy take without copy).

    A call borrows what it does not hand to the caller from the driver's memory pool
    (`runtime.pool`): the copies of host inputs, the temporaries, host outputs on their
    way back and the status word. Outputs and temporaries start at zero, except the
    tensors the kernels write whole before reading them (`written`), which are not
    filled (with `TCPY_POISON=1`, filled with all-ones bytes, so that an element the
    kernels failed to write shows). The kernels are launched back to back; the call
    synchronises once, after the last, and then checks the status word. With
    `asynchronous`, a call whose outputs all stay on the device returns without
    waiting: its status word is read at the next call on the GPU or at
    `runtime.settle` (`ExecutionEngine.synchronize`), which raise its failure then."""

    cdef: CheckedDef
    source: str
    functions: list[Any]
    launches: list[Launch]
    options: MappingOptions
    written: frozenset[str] = frozenset()
    asynchronous: bool = False
    generic: bool = False
    cache_key: str = ""
    accepts_device_out: ClassVar[bool] = True

    def __call__(self, binding: Binding, out: Outputs = None) -> tuple[Any, ...]:
        from tcpy.binding import DeviceInput
        from tcpy.runtime import cuda as runtime
        from tcpy.runtime.status import check_status

        drv = runtime.driver()
        runtime.settle(drv)  # an earlier call's failure is reported before this one runs
        memory = runtime.pool(drv)
        cdef = self.cdef
        borrowed: list[int] = []  # given back to the pool when the call ends
        handed: list[int] = []  # the caller's, unless the call fails
        dests = out or (None,) * len(cdef.outputs)

        def borrow(nbytes: int) -> int:
            borrowed.append(memory.acquire(nbytes))
            return borrowed[-1]

        try:
            pointers = []
            for a in binding.arrays:
                if isinstance(a, DeviceInput):
                    pointers.append(a.pointer)
                else:
                    pointers.append(borrow(a.nbytes))
                    drv.to_device(pointers[-1], a)
            results = []
            tensors = (*cdef.outputs, *cdef.temporaries)
            for t, dest in zip(tensors, (*dests, *(None,) * len(cdef.temporaries)), strict=True):
                shape = binding.shape_of(t)
                nbytes = int(np.prod(shape, dtype=np.int64)) * t.scalar.dtype.itemsize
                if isinstance(dest, DeviceInput):
                    pointer = dest.pointer
                elif t.role is Role.OUTPUT and dest is None and binding.on_device:
                    pointer = drv.alloc(max(nbytes, 1))  # a DeviceArray of the caller's
                    handed.append(pointer)
                else:
                    pointer = borrow(nbytes)
                if t.name not in self.written:
                    drv.memset(pointer, 0, nbytes)
                elif knobs.poison_buffers():
                    drv.memset(pointer, 0xFF, nbytes)
                results.append((t, shape, pointer, dest))
                pointers.append(pointer)
            status = borrow(4)
            drv.memset(status, 0, 4)
            args = [("i64", binding.sizes[s]) for s in cdef.size_symbols]
            args += [("ptr", p) for p in pointers] + [("ptr", status)]
            for function, (grid, block) in zip(self.functions, self.launches, strict=True):
                drv.launch(function, grid, block, args)
            stays = all(dest is None or isinstance(dest, DeviceInput) for dest in dests)
            if self.asynchronous and binding.on_device and stays:
                runtime.defer(drv, borrowed.pop(), cdef.name)  # the status word, read later
                outputs = self._collect(drv, binding, results)
                handed.clear()
                return tuple(outputs)
            drv.synchronize()  # once per call: a failed launch raises here
            code = np.zeros(1, np.int32)
            drv.to_host(code, status)
            check_status(int(code[0]))
            outputs = self._collect(drv, binding, results)
            handed.clear()
            return tuple(outputs)
        finally:
            for pointer in borrowed:
                memory.release(pointer)
            for pointer in handed:  # the call failed before handing them over
                drv.free(pointer)

    @staticmethod
    def _collect(drv: Any, binding: Binding, results: list[Any]) -> list[Any]:
        """The outputs: the destinations given (a host one copied into), else new
        arrays on the device for device inputs, on the host for host inputs."""
        from tcpy.binding import DeviceInput
        from tcpy.runtime import cuda as runtime

        outputs: list[Any] = []
        for t, shape, pointer, dest in results:
            if isinstance(dest, DeviceInput):
                outputs.append(dest)
            elif t.role is not Role.OUTPUT:
                continue
            elif dest is not None or not binding.on_device:
                host = np.empty(shape, t.scalar.dtype) if dest is None else dest
                drv.to_host(host, pointer)
                outputs.append(host)
            else:
                outputs.append(runtime.DeviceArray(shape, t.scalar.dtype, pointer, drv))
        return outputs


class Cuda(Target):
    """The CUDA target: NVRTC to a cubin for the device, launched through the driver.
    `asynchronous`: calls whose outputs stay on the device do not wait for their
    kernels (`GpuKernels`)."""

    name = "cuda"
    accepts_device_arrays = True

    def __init__(self, asynchronous: bool = False) -> None:
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
                cubin = nvrtc.compile_cubin(lowered.source, arch)
            (directory / "kernel.cubin").write_bytes(cubin)
            _write_launches(directory, lowered.mapping)
            return _write_record(directory, lowered.options, lowered.clock_forced, lowered.scop)

        def load(directory: Path) -> Kernel:
            source = (directory / "kernel.cu").read_text()
            built_with, written = _read_record(directory)
            if drv is None:
                return NoGpu(source, built_with)
            launches = _read_launches(directory)
            names = [f"tc_kernel_{k}" for k in range(len(launches))]
            functions = drv.load((directory / "kernel.cubin").read_bytes(), names)
            return GpuKernels(
                cdef, source, functions, launches, built_with, written, self.asynchronous
            )

        return _compiled(
            self.name, cdef, binding, options, session, build,
            device=f"{profile.key()} {arch}", toolchain=nvrtc.identity(), load=load,
        )  # fmt: skip


@dataclass(frozen=True)
class NoGpu:
    """CUDA kernels compiled on a machine without a GPU: the source (and a cubin for
    `TCPY_CUDA_ARCH`) exist, running them is an error."""

    source: str
    options: MappingOptions
    generic: bool = False
    cache_key: str = ""

    def __call__(self, binding: Binding, out: Outputs = None) -> tuple[Any, ...]:
        from tcpy.runtime import cuda as runtime

        runtime.driver()  # raises the TCLaunchError that says why there is no GPU
        raise TCError("a GPU appeared after these kernels were compiled; compile again")


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
    return DiskCache.open(root, cap) if root is not None else None
