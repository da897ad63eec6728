"""Crash-safe file writes.

A file written with :func:`atomic_write` is either the old version or the new one, never a mix:
the data goes to a temporary file in the same directory, is flushed to disk, and then renamed over
the target. The previous version is kept next to it as ``<name>.bak``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path


def backup_path(path: str | os.PathLike[str]) -> Path:
    """Where :func:`atomic_write` keeps the previous version of ``path``."""
    p = Path(path)
    return p.with_name(p.name + ".bak")


def atomic_write(
    path: str | os.PathLike[str],
    data: str | bytes,
    backup: bool = True,
    mode: int | None = None,
) -> Path:
    """Replace the file at ``path`` with ``data`` atomically and return the path written.

    ``str`` data is written as UTF-8. A symlink is followed, so the link itself stays in place.
    With ``backup``, the previous file (if any) is kept as ``<name>.bak`` (a hard link when the
    filesystem allows it, else a copy). The new file gets ``mode`` if given, else the old file's
    permission bits, else the usual default for a new file (0o666 less the umask).
    """
    target = Path(os.path.realpath(path))
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        old_mode: int | None = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        old_mode = None
    if mode is None:
        mode = old_mode if old_mode is not None else 0o666 & ~_umask()

    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        if backup and old_mode is not None:
            _keep_backup(target)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(target.parent)
    return target


def _keep_backup(target: Path) -> None:
    """Make ``<target>.bak`` the current content of ``target``, replacing any older backup."""
    bak = backup_path(target)
    fd, staging_name = tempfile.mkstemp(dir=target.parent, prefix=f".{bak.name}.", suffix=".tmp")
    os.close(fd)
    staging = Path(staging_name)
    try:
        staging.unlink()
        try:
            os.link(target, staging)
        except OSError:
            shutil.copy2(target, staging)
        os.replace(staging, bak)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            staging.unlink()
        raise


def _umask() -> int:
    """The process umask, read without changing it (``os.umask`` would race other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _fsync_dir(directory: Path) -> None:
    """Flush the rename itself to disk (best effort: not every filesystem allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
