"""Claims on a SQLite store: OS locks on the database file itself (rule S7).

A claim is an exclusive lock on one byte of the database file plus a ``flock`` on a
lock file beside it holding the holder's pid, so every path to the file (a symlink, a
hard link, a relative path) meets the same claim, and the OS releases it when the
process dies, however it dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import threading
import zlib

from storage_adapters._base import Claim, KVStore, StoreClaimedError, check_role
from wire.errors import StoreError

#: A claim locks one byte of the database file, at this offset plus a hash of its role:
#: far above anything SQLite writes or locks (its lock page is at 1 GiB). A lock past
#: the end of a file is allowed and leaves the file as it is.
_CLAIM_BYTE_BASE = 1 << 62


def _claim_byte(role: str) -> int:
    return _CLAIM_BYTE_BASE + zlib.crc32(role.encode())


def _lock_byte(fd: int, offset: int, *, lock: bool) -> None:
    """An open-file-description lock (Linux ``F_OFD_SETLK``) on one byte, or its release.

    Not ``flock``: on NFS that is emulated with whole-file POSIX locks, which would
    conflict with SQLite's own. Not a classic POSIX lock either: those belong to the
    process, so SQLite closing one of its descriptors would drop ours. Raises
    ``BlockingIOError`` (or ``PermissionError``) when another open file holds it.
    """
    kind = fcntl.F_WRLCK if lock else fcntl.F_UNLCK
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks).
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", kind, os.SEEK_SET, offset, 1, 0))


def _lock_holder(fd: int) -> str | None:
    """The pid a claim's holder wrote into its lock file, if it has yet."""
    with contextlib.suppress(OSError, ValueError):
        return f"pid {int(os.pread(fd, 32, 0).decode().strip())}"
    return None


class SQLiteClaims(KVStore):
    """The claims of :class:`~storage_adapters.sqlite.SQLiteStore`, kept apart from its
    reads and writes: they lock the file, not rows. The store sets the state below in
    its ``__init__`` and calls :meth:`_release_claims` when it closes."""

    #: Guards the connection and the claims (the store's one lock).
    _lock: threading.Lock
    _closed: bool
    _claims: dict[str, Claim]
    #: The database file itself, resolved when the store opened (a later chdir must not
    #: move it), and the descriptor that holds the claims' locks on it, opened by the
    #: first claim.
    _real_path: str
    _claim_fd: int | None

    def claim_file(self, role: str) -> str:
        """The file that names ``role``'s holder (its pid): next to the database file,
        symlinks resolved."""
        return f"{self._real_path}.{check_role(role)}.lock"

    def claim(self, role: str) -> Claim:
        """An exclusive lock on one byte of the database file itself (:func:`_lock_byte`),
        plus a ``flock`` on :meth:`claim_file` with this process's pid in it.

        The lock on the database file is what makes the claim one per database, however
        it was reached: a path naming it through a symlink or a hard link, or a relative
        path, meets the same lock (a lock file named from the path as given did not, and
        two oracles served one store, rule S7). Both locks belong to one open file, so a
        second claim conflicts whether it comes from another process or from another
        handle in this one; the OS releases them when the process dies, however it dies.
        The lock file is never deleted: unlinking it would let two processes lock two
        different files.
        """
        path = self.claim_file(role)
        with self._lock:
            if self._closed:
                raise ValueError("store is closed")
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise StoreError(f"cannot open lock file {path}: {exc}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:  # EWOULDBLOCK: another open file holds it
                holder = _lock_holder(fd)
                os.close(fd)
                if holder == f"pid {os.getpid()}":
                    holder += " (this process)"
                raise StoreClaimedError(
                    f"{role} of {self.url} is held by {holder or 'another process'} "
                    f"(lock file {path})",
                    role=role,
                    holder=holder,
                    where=path,
                ) from exc
            except OSError as exc:
                os.close(fd)
                raise StoreError(f"cannot lock {path}: {exc}") from exc
            try:
                self._lock_database_byte(role)
            except BaseException:
                os.close(fd)
                raise
            with contextlib.suppress(OSError):  # the pid only helps the operator
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            claim = Claim(
                role, path, exclusive=True, on_release=lambda: self._unclaim(role, fd, claim)
            )
            self._claims[role] = claim
            return claim

    def _lock_database_byte(self, role: str) -> None:
        """Lock ``role``'s byte of the database file; the caller holds ``self._lock`` and
        the role's lock file, so no other claim of this handle holds the byte."""
        if not hasattr(fcntl, "F_OFD_SETLK"):
            # Not Linux: the lock file next to the resolved path is the claim (it sees
            # through symlinks, not through hard links).
            return
        if self._claim_fd is None:
            try:
                self._claim_fd = os.open(self._real_path, os.O_RDWR | os.O_CLOEXEC)
            except OSError as exc:
                raise StoreError(f"cannot open {self._real_path} to claim it: {exc}") from exc
        try:
            _lock_byte(self._claim_fd, _claim_byte(role), lock=True)
        except (BlockingIOError, PermissionError) as exc:  # EAGAIN / EACCES: held
            try:
                st = os.fstat(self._claim_fd)
                file_id = f"device {st.st_dev}, inode {st.st_ino}"
            except OSError:
                file_id = "the same file"
            where = f"the database file {self._real_path} ({file_id})"
            raise StoreClaimedError(
                f"{role} of {self.url} is held on {where} by another process (or handle) "
                "that may have reached it by another path",
                role=role,
                holder=None,
                where=where,
            ) from exc
        except OSError as exc:
            raise StoreError(f"cannot lock {self._real_path}: {exc}") from exc

    def _unclaim(self, role: str, fd: int, claim: Claim) -> None:
        with self._lock:
            if self._claim_fd is not None:
                with contextlib.suppress(OSError):  # closing the descriptor releases it
                    _lock_byte(self._claim_fd, _claim_byte(role), lock=False)
            if self._claims.get(role) is claim:
                del self._claims[role]
        os.close(fd)  # releases the flock, after the byte: never the byte alone held

    def _release_claims(self) -> None:
        """Release every claim taken through this store, then close the descriptor that
        held their locks on the database file."""
        with self._lock:
            claims = list(self._claims.values())
        for claim in claims:
            claim.release()
        with self._lock:
            fd, self._claim_fd = self._claim_fd, None
        if fd is not None:
            os.close(fd)
