"""What the GPU mapping's step 2 chose for a band (`tcpy.mapping.gpu.strategy`), which
the later steps and the tensor-core mapping (`tcpy.mapping.gpu.matrix`) read."""

from __future__ import annotations

from typing import NamedTuple

import islpy as isl

from tcpy.mapping.gpu.device import DeviceProfile
from tcpy.mapping.options import MappingOptions


class Plan(NamedTuple):
    """What step 2 chose for a band: the options, the device, whether the band is
    permutable, how many of its members are parallel, those on the grid (by grid
    dimension, x first), the lane member (the band's last, or None) and the shared
    memory budget every step 3 decision is made within."""

    options: MappingOptions
    device: DeviceProfile
    permutable: bool
    prefix: int
    members: list[int]
    lanes: int | None
    budget: int  # the bytes of shared memory a block may use (`device.shared_budget`)
    at: isl.Set | None = None  # the launch's sizes, for the grid (`map_to_gpu`)
