"""An exclusive lock on an open file that the OS drops when its process dies.

``fcntl.flock`` on POSIX, ``msvcrt.locking`` on Windows, each imported only
where it exists, so that ``import fusee`` works on both.

The rule: the lock never covers bytes SQLite reads or writes. Windows locks
are mandatory, so there it is one byte of SQLite's lock-byte page (the page
at 1 GiB, which never holds data) past the 512 bytes SQLite locks itself
(`WINDOWS_OFFSET`); fusee's databases have 4096-byte pages, so the byte is
in that page. An flock locks no bytes at all.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import IO, Any, Final

__all__ = ["WINDOWS_OFFSET", "try_lock", "unlock"]

WINDOWS_OFFSET: Final = 0x40000000 + 512
"""The byte locked on Windows: in SQLite's lock-byte page, after SQLite's own lock bytes."""


def try_lock(f: IO[Any]) -> bool:
    """Takes an exclusive lock on ``f`` without waiting; False when another holder has it.

    A second lock on the same file fails also from the same process (each
    open file is its own holder), which is how a second writer is refused.
    Closing the file releases the lock.

    Raises:
        OSError: The file system does not take locks.

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile() as f, open(f.name, "rb") as other:
        ...     (try_lock(f), try_lock(other))
        (True, False)
    """
    if sys.platform == "win32":
        import msvcrt

        os.lseek(f.fileno(), WINDOWS_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EDEADLOCK):
                return False
            raise
        return True
    import fcntl

    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def unlock(f: IO[Any]) -> None:
    """Releases the lock `try_lock` took on ``f`` (closing ``f`` does too).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryFile() as f:
        ...     try_lock(f)
        ...     unlock(f)
        True
    """
    if sys.platform == "win32":
        import msvcrt

        os.lseek(f.fileno(), WINDOWS_OFFSET, os.SEEK_SET)
        msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)
        return
    import fcntl

    fcntl.flock(f.fileno(), fcntl.LOCK_UN)
