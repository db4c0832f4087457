"""One writer per output: a study folder, a train run's folder, a sweep's folder.

`held(path, what)` takes an exclusive lock on the file `path` for the length of a `with` block,
before the run writes anything. The file holds its holder as `pid@host`. A second run on the
same output gets one line naming the holder (LockError) and changes nothing. The lock is the
kernel's (`fcntl.flock`), so it ends with its holder however that ends (SIGKILL, an OOM kill):
a later run takes over a lock file left by a process that is gone, and says so in one line.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from pathlib import Path

from seamkit.config import SeamkitError
from seamkit.report import writer


class LockError(SeamkitError):
    """Another live run holds the output; one line naming it."""


def _open_locked(path: Path, what: str) -> int:
    """An open descriptor of `path` that this process holds the lock of; LockError if another does."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise LockError(f"{what} is in use by {holder} (lock {path}); wait for it to end, or write "
                            f"elsewhere") from None
        except BaseException:
            os.close(fd)
            raise
        try:  # the previous holder may have removed the file between our open and our lock: then again
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


@contextlib.contextmanager
def held(path, what: str):
    """Hold the lock file `path` (its folder is created) for the block; `what` names the output in
    the one-line errors. The file goes when the block ends."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_locked(path, what)
    try:
        left = os.pread(fd, 200, 0).decode(errors="replace").strip()
        if left:
            print(f"seamkit: taking over {what}: its lock was left by {left}, which is no longer running",
                  file=sys.stderr, flush=True)
        os.ftruncate(fd, 0)
        os.pwrite(fd, writer().encode(), 0)
        os.fsync(fd)
        yield path
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # before the unlock: whoever opened it meanwhile sees another inode and opens again
        os.close(fd)
