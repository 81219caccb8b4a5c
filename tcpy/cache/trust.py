"""Which cache directories tcpy trusts: checks of ownership and modes, private
directories made 0700, and the one warning per root that an unusable cache gives.

Trust, as ssh does for its keys. Another local user must not be able to swap a kernel
or a tuned record in, so a directory is trusted only if it is owned by the current
(effective) user and not writable by group or others; root-owned directories are not
trusted either, unless we are root.
- The root (`TCPY_CACHE_DIR`, or the default under the user's cache directory) may be
  the user's own directory, so its mode is never changed; a missing root is created
  0700. It must be a directory (a symlink to one is followed) owned by us
  (`check_owner`). If it is also writable by others (say a scratch directory the user
  made 0777), it is used only as a container: everything tcpy reads is in `v1/` and
  `tuned/`, which must be ours and private, so others can at most remove them, not
  replace their contents.
- Inside the root, every directory tcpy creates or traverses (`v1`, `v1/tmp`, the
  shards, the entries, `tuned`, `tuned/v1`) must be a real directory (not a symlink),
  ours, and not writable by others (`check_private`); tcpy creates them 0700
  (`private_dir`).
- Checks are repeated on every lookup and store (a few `stat` calls), so a directory
  whose mode changes after the cache is opened is refused from then on. Between the
  check and the use there remains the usual window of any path-based check.

A refused directory raises `Refused`, which says what is wrong and how to mend it; what
the caller does then (run without the cache, discard an entry, report an error) is its
own business.
"""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

from tcpy.errors import TCWarning


class Refused(Exception):
    """A cache directory tcpy will not use: `what` happened, `fix` says how to mend it."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(what)
        self.what = what
        self.fix = fix


def check_owner(path: Path, st: os.stat_result) -> None:
    """`path`, whose `stat` is `st`, is a directory owned by us."""
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(f"the cache directory {path} is not a directory", f"remove {path}")
    if st.st_uid != os.geteuid():
        raise Refused(
            f"the cache directory {path} is owned by another user (uid {st.st_uid})",
            f"remove {path}, or use a directory of your own",
        )


def check_private(path: Path) -> None:
    """`path` is a real directory (not a symlink), ours, and nobody else can write it."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise Refused(f"the cache directory {path} is a symbolic link", f"remove {path}")
    check_owner(path, st)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Refused(
            f"the cache directory {path} is writable by other users", f"chmod go-w {path}"
        )


def private_dir(path: Path) -> Path:
    """`path`, created 0700 if missing, checked private if not."""
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # the umask may have taken the owner's bits away
    except FileExistsError:
        pass  # made earlier, or by someone else in a race: the check below decides
    check_private(path)
    return path


_warned: set[Path] = set()


def warn_once(root: Path, message: str) -> None:
    """One warning per root and process: a long run that cannot cache says so once."""
    if root not in _warned:
        _warned.add(root)
        warnings.warn(message, TCWarning, stacklevel=4)
