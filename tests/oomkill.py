"""A real OOM kill for the drills: a process moved into a memory cgroup with a small limit is
killed by the kernel's OOM killer on its next allocations (``Memory cgroup out of memory:
Killed process PID``), as a rank is when its host runs out of RAM.

Needs root and a writable memory controller (cgroup v1 ``/sys/fs/cgroup/memory`` or v2 with
``memory`` in ``cgroup.controllers``). Without one the drill is skipped, except under CI=true,
where it fails: CI runs as root on machines that have one.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

V1 = Path("/sys/fs/cgroup/memory")
V2 = Path("/sys/fs/cgroup")


def _parent() -> tuple[Path, str] | None:
    """Where a memory cgroup can be made, and its limit file's name."""
    if (V1 / "memory.limit_in_bytes").exists() and os.access(V1, os.W_OK):
        return V1, "memory.limit_in_bytes"
    controllers = V2 / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split() \
            and os.access(V2, os.W_OK):
        return V2, "memory.max"
    return None


def needs_memory_cgroup() -> None:
    if _parent() is None:
        message = "no writable memory cgroup controller (root, cgroup v1 memory or v2 memory)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)


class MemoryCage:
    """A memory cgroup of ``limit`` bytes; :meth:`put` moves a process in. Removed on exit
    (once the processes in it are gone)."""

    def __init__(self, limit: int = 16 << 20) -> None:
        found = _parent()
        assert found is not None, "needs_memory_cgroup() first"
        parent, self._limit_file = found
        self.path = parent / f"svconsole-drill-{uuid.uuid4().hex[:8]}"
        self.limit = limit

    def __enter__(self) -> MemoryCage:
        self.path.mkdir()
        (self.path / self._limit_file).write_text(str(self.limit))
        return self

    def put(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def __exit__(self, *exc: object) -> None:
        try:
            self.path.rmdir()
        except OSError:  # a process still inside: move it back out first
            for line in (self.path / "cgroup.procs").read_text().split():
                try:
                    (self.path.parent / "cgroup.procs").write_text(line)
                except OSError:
                    pass
            try:
                self.path.rmdir()
            except OSError:
                pass
