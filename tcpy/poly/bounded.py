"""Run an isl computation under a wall-clock deadline that really stops it.

isl's operation budget (`ctx.set_max_operations`) counts too coarsely to bound time:
its scheduler can spend seconds per counted operation solving ILPs, so a kernel of
three statements under a fusing strategy ran for minutes within budget. Python cannot
interrupt a call into C either. So the computation runs in a forked child process
(copy-on-write: the child sees the parent's isl objects as they are, at a cost of a
few milliseconds), which sends back its result as isl text; past the deadline the
child is killed and the caller falls back to something cheaper.

The child runs only isl code and writes to a pipe: it imports nothing and takes no
Python lock, so forking from a process with other threads (OpenMP's, a caller's) is
safe. Where `fork` does not exist the computation runs in-process, without deadline.
"""

from __future__ import annotations

import os
import select
import signal
import time
import traceback
from collections.abc import Callable

import islpy as isl

from tcpy.errors import InternalError


class DeadlineExceeded(Exception):
    """The computation ran past its deadline and was stopped."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(f"stopped after {seconds:g} s")


_OK, _ISL, _BUG = b"0", b"1", b"2"


def run_bounded(compute: Callable[[], str], seconds: float) -> str:
    """`compute()`, run in a child process and stopped after `seconds`. An isl
    failure in the child (its operation budget included) is raised here as `isl.Error`;
    any other exception as `InternalError` with the child's traceback."""
    if not hasattr(os, "fork"):
        return compute()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, report, and leave without cleanup
        os.close(read_end)
        _child(compute, write_end)
    os.close(write_end)
    try:
        data = _read_until(read_end, pid, time.monotonic() + seconds)
    finally:
        os.close(read_end)
    if data is None:
        raise DeadlineExceeded(seconds)
    tag, text = data[:1], data[1:].decode()
    if tag == _OK:
        return text
    if tag == _ISL:
        raise isl.Error(text)
    raise InternalError(f"an isl computation failed in its child process:\n{text}")


def _child(compute: Callable[[], str], fd: int) -> None:
    code = 0
    try:
        try:
            payload = _OK + compute().encode()
        except isl.Error as e:
            payload = _ISL + str(e).encode()
        except BaseException:
            payload = _BUG + traceback.format_exc().encode()
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _read_until(fd: int, pid: int, deadline: float) -> bytes | None:
    """Everything the child writes before it closes the pipe, or None if the deadline
    passes first (the child is then killed). The child is always reaped."""
    chunks: list[bytes] = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.waitpid(pid, 0)
    data = b"".join(chunks)
    if not data:
        raise InternalError("an isl computation's child process died without an answer")
    return data
