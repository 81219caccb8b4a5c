"""The disk cache: compiled kernels (`kernels`) and tuned options (`tuned`) under one
root, the trust rules both obey (`trust`), their administration (`admin`) and the
`tcpy cache` command (`cli`).

The modules import in one direction, trust < kernels < tuned < admin < cli; this
package re-exports what the engine and its targets use. The `tcpy cache` command is
imported from `tcpy.cache.cli`, so that opening a cache does not load argparse.
"""

from __future__ import annotations

from tcpy.cache.admin import enforce_cap
from tcpy.cache.kernels import DiskCache, cache_key, compiled, scratch_directory, tcpy_version
from tcpy.cache.trust import Refused
from tcpy.cache.tuned import TunedStore, tuned_key

__all__ = [
    "DiskCache",
    "Refused",
    "TunedStore",
    "cache_key",
    "compiled",
    "enforce_cap",
    "scratch_directory",
    "tcpy_version",
    "tuned_key",
]
