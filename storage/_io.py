"""Durable file operations: fsync'd atomic replace, directory fsync, the single-writer lock."""

from __future__ import annotations

import errno
import fcntl
import os
from concurrent.futures import ThreadPoolExecutor

from mvdb.kernels.errors import DatabaseLockedError, MvdbError, StorageError

# Threads for work that releases the GIL: checksums, pwrite, numpy checks over chunks.
POOL = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 2) + 1, thread_name_prefix="mvdb-io")
# Reads wait on the disk more than on a core: more in flight than there are cores.
READ_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="mvdb-read")


def storage_error(e: OSError, path: str, doing: str) -> OSError:
    """An OSError from the operating system as a StorageError naming the path and errno (mvdb's
    own errors pass through)."""
    if isinstance(e, MvdbError) or not isinstance(e, OSError):
        return e
    where = e.filename or path
    err = StorageError(e.errno, f"{doing} failed: {e.strerror or e}", where)
    err.__cause__ = e
    return err


def _libc_sync_file_range():
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
        fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
        return fn
    except (OSError, AttributeError):
        return None


_SYNC_FILE_RANGE = _libc_sync_file_range()


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask Linux to start writing a file range to disk now (SYNC_FILE_RANGE_WRITE), so that the
    final fsync overlaps with the rest of the writing instead of following it. A no-op elsewhere."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, nbytes, 2)


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes) -> None:
    """Write data to path so that a crash leaves either the old or the new content: temp, fsync, rename, fsync dir."""
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


class WriterLock:
    """An exclusive, non-blocking flock on the database directory itself, released by release()
    or process death. A directory cannot be unlinked and replaced while it holds files, so the lock
    cannot be lost the way a lock file can (deleting ``LOCK`` let a second writer in)."""

    def __init__(self, db_path: str):
        self.path = db_path
        self._fd = os.open(db_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(self._fd)
            self._fd = None
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DatabaseLockedError(
                    f"{db_path}: another process holds the writer lock (on the directory; or another handle in this process); "
                    f"open it with read_only=True or close the other writer"
                ) from None
            raise

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
