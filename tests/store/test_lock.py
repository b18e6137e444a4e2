"""The writer's file lock: flock on POSIX, msvcrt.locking on Windows (simulated here).

The Windows branch runs against a stand-in for ``msvcrt`` that keeps
Windows' rules (a byte range held by one open file at a time, released by
unlocking the same range), so its offsets and error handling are tested on
any system.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fusee.store import _lock
from fusee.store.sqlite import PAGE_SIZE


def test_a_second_open_file_cannot_take_the_lock_until_the_first_releases_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "fusee.db"
    path.write_bytes(b"")
    with path.open("rb") as first, path.open("rb") as second:
        assert _lock.try_lock(first)
        assert not _lock.try_lock(second)
        _lock.unlock(first)
        assert _lock.try_lock(second)
    with path.open("rb") as third:  # closing released it
        assert _lock.try_lock(third)


class FakeMsvcrt:
    """What ``msvcrt.locking`` does: LK_NBLCK fails with EACCES on a range another file holds."""

    LK_UNLCK = 0
    LK_NBLCK = 2

    def __init__(self) -> None:
        self.held: dict[tuple[int, int], int] = {}
        self.fail_with: int | None = None

    def locking(self, fd: int, mode: int, nbytes: int) -> None:
        assert nbytes == 1
        key = (os.fstat(fd).st_ino, os.lseek(fd, 0, os.SEEK_CUR))
        if self.fail_with is not None:
            raise OSError(self.fail_with, os.strerror(self.fail_with))
        if mode == self.LK_NBLCK:
            if key in self.held:
                raise OSError(errno.EACCES, "Permission denied")
            self.held[key] = fd
        else:
            assert mode == self.LK_UNLCK
            assert self.held.pop(key) == fd


@pytest.fixture
def msvcrt(monkeypatch: pytest.MonkeyPatch) -> FakeMsvcrt:
    fake = FakeMsvcrt()
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setitem(sys.modules, "msvcrt", fake)
    return fake


def test_on_windows_one_byte_past_any_database_is_locked_and_a_second_holder_refused(
    tmp_path: Path, msvcrt: FakeMsvcrt
) -> None:
    path = tmp_path / "fusee.db"
    path.write_bytes(b"x" * 4096)
    with path.open("rb") as first, path.open("rb") as second:
        assert _lock.try_lock(first)
        assert list(msvcrt.held) == [(os.fstat(first.fileno()).st_ino, _lock.WINDOWS_OFFSET)]
        # In SQLite's lock-byte page (from 1 GiB), after the 512 bytes of its own locks.
        assert 0x40000000 + 512 <= _lock.WINDOWS_OFFSET < 0x40000000 + PAGE_SIZE
        assert not _lock.try_lock(second)
        _lock.unlock(first)
        assert msvcrt.held == {}
        assert _lock.try_lock(second)


def test_on_windows_a_locking_error_other_than_a_held_lock_is_raised(
    tmp_path: Path, msvcrt: FakeMsvcrt
) -> None:
    path = tmp_path / "fusee.db"
    path.write_bytes(b"")
    msvcrt.fail_with = errno.EINVAL
    with path.open("rb") as f, pytest.raises(OSError, match="Invalid argument"):
        _lock.try_lock(f)


def test_import_fusee_needs_no_fcntl() -> None:
    # Windows has no fcntl: the store's lock imports it only when it locks.
    code = "import sys; sys.modules['fcntl'] = None; import fusee; print(fusee.Engine.__name__)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "Engine\n", "")
