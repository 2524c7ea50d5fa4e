"""Folders replaced atomically: at every instant a reader finds the old complete folder or the
new complete one, never a half-written or a missing one (adapter versions, checkpoints).

The new folder is written beside the target under a temporary name and flushed to disk; then
the two are swapped in one step with Linux's `renameat2(RENAME_EXCHANGE)` (or, when there is
no old folder, renamed into place), and the old one is removed. A process killed at any point
leaves the target whole; its temporary folder is cleared by the next write.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> None:
    """Swap two paths in one atomic step (Linux >= 3.15); OSError where that is not supported."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _swap_in(new: Path, final: Path) -> None:
    """Put `new` at `final`; an old `final` ends up at `new` (to be removed)."""
    if not final.exists():
        os.rename(new, final)
        return
    try:
        _exchange(new, final)
    except OSError:  # no atomic exchange here (not Linux, or the file system refuses it)
        aside = new.with_name(new.name + "-old")
        os.rename(final, aside)
        os.rename(new, final)
        os.rename(aside, new)


def write_dir(final: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Fill a fresh folder with `write(folder)` and make it `final` atomically; returns `final`."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".{final.name}-tmp*"):  # left by a process killed mid-write
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-tmp", dir=final.parent))
    try:
        write(tmp)
        _fsync_tree(tmp)
        _swap_in(tmp, final)
        _fsync_dir(final.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


__all__ = ["write_dir"]
