"""The CPU mapping: tiles, loop order, register blocks, OpenMP marks and copies
(`strategy` lists its steps)."""

from tcpy.mapping.cpu.registers import fresh_blocks
from tcpy.mapping.cpu.strategy import cpu_defaults, map_to_cpu

__all__ = ["cpu_defaults", "fresh_blocks", "map_to_cpu"]
