"""The GPU mapping: loop nests become CUDA kernels (`strategy` lists its steps)."""

from tcpy.mapping.gpu.kernel import GpuMapping, MappedKernel
from tcpy.mapping.gpu.strategy import cuda_defaults, map_to_gpu

__all__ = ["GpuMapping", "MappedKernel", "cuda_defaults", "map_to_gpu"]
