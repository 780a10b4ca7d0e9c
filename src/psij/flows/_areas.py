"""The flow service's files for each user: uploaded payloads and the instances' sandboxes.

Layout, under the sandbox root the flow machine is configured with::

    <root>/<uid>/payloads/<sha256>       an uploaded executable
    <root>/<uid>/<handle>/<n>.out|.err   an instance's output

``<root>`` is the service's own (0700; 0711 for a root service, so that users can reach their
folder but list nothing), each ``<root>/<uid>`` and everything in it belongs to that user
(mode 0700): their instances, which run as them, can execute the payload and write their
output, and no other user can list or read anything in it. Root works inside folders a user
owns, where that user could put a symbolic link in place of any name: so every path is walked
one level at a time from a directory descriptor with ``O_NOFOLLOW``, every file is checked to
be a regular file of that user after it is opened, and files are written under a new name and
renamed into place. A link the user planted makes the operation fail for that user; it never
reaches a file outside the area. Paths outside ``<root>/<uid>`` are refused.

Payloads are content addressed: the name is the sha256 of the bytes, and :meth:`Areas.payload`
checks the bytes again before every start (skipping the hash when the file's inode, size,
change and modification times are those last verified: changing the contents changes the
change time, which no user can set back).
"""

import errno
import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Dict, Iterable, Optional, Set, Tuple, Union

from psij._private_dirs import ensure_private_dir

__all__ = ["SHA256_RE", "AreaError", "Areas"]

PathLike = Union[str, "os.PathLike[str]"]
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class AreaError(Exception):
    """A file of a user's area cannot be used; the message says which and why."""


class Areas:
    """The per-user areas under ``root``; ``multi_user`` for a root service."""

    def __init__(self, root: Path, multi_user: bool) -> None:
        self.multi_user = multi_user
        self._uid = os.geteuid()
        self.top = ensure_private_dir(Path(root), "flow sandbox root")
        os.chmod(self.top, 0o711 if multi_user else 0o700)
        self._verified: Dict[Tuple[int, str], Tuple[int, int, int, int]] = {}
        self._users: Set[int] = set()

    # -- walking ----------------------------------------------------------------------------

    def user_dir(self, uid: int) -> Path:
        """The area of ``uid`` (made when missing)."""
        if not self.multi_user and uid != self._uid:
            raise AreaError(f"uid {uid}: this service serves only uid {self._uid}")
        path = self.top / str(int(uid))
        if uid in self._users:
            return path  # checked once: only this process can rename or remove it in top
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        else:
            if uid != self._uid:
                os.chown(path, uid, _gid_of(uid), follow_symlinks=False)
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or info.st_mode & 0o077:
            raise AreaError(f"{path}: expected a directory of uid {uid} with mode 0700")
        self._users.add(uid)
        return path

    def _parts(self, uid: int, path: PathLike) -> Tuple[str, ...]:
        """``path``'s names below ``<root>/<uid>`` (AreaError for any other path)."""
        base = self.user_dir(uid)
        rel = os.path.relpath(os.path.abspath(path), base)
        parts = tuple(Path(rel).parts)
        if not parts or parts[0] in ("..", ".") or os.path.isabs(rel):
            raise AreaError(f"{path}: not inside the flow area of uid {uid} ({base})")
        for part in parts:
            _check_name(part)
        return parts

    def _dir_fd(self, uid: int, parts: Tuple[str, ...], create: bool) -> int:
        """A descriptor of ``<root>/<uid>/<parts...>``, walked without following links."""
        fd = os.open(self.user_dir(uid), _DIR_FLAGS)
        try:
            for part in parts:
                _check_name(part)
                if create:
                    try:
                        os.mkdir(part, 0o700, dir_fd=fd)
                    except FileExistsError:
                        pass
                    else:
                        if uid != self._uid:
                            os.chown(part, uid, _gid_of(uid), dir_fd=fd, follow_symlinks=False)
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as ex:
                    raise AreaError(f"{part}: cannot open in the flow area of uid {uid}: "
                                    f"{ex.strerror or ex} (a symbolic link is refused)") from ex
                os.close(fd)
                fd = child
                if os.fstat(fd).st_uid != uid:
                    raise AreaError(f"{part}: not owned by uid {uid}; refused")
            return fd
        except BaseException:
            os.close(fd)
            raise

    def make_dir(self, uid: int, path: PathLike) -> None:
        """Make the folder ``path`` of ``uid``'s area (and those above it), 0700, theirs."""
        os.close(self._dir_fd(uid, self._parts(uid, path), True))

    # -- payloads ---------------------------------------------------------------------------

    def upload(self, uid: int, data: bytes, digest: Optional[str] = None) -> str:
        """Store ``data`` as an executable payload of ``uid``; its path."""
        actual = hashlib.sha256(data).hexdigest()
        if digest is not None and digest != actual:
            raise AreaError(f"payload: the bytes have sha256 {actual}, not {digest}")
        fd = self._dir_fd(uid, ("payloads",), True)
        try:
            try:
                self._verify_at(fd, uid, actual)
                return str(self.top / str(uid) / "payloads" / actual)  # there, intact
            except AreaError:
                pass
            tmp = f".{actual}.{os.getpid()}.tmp"
            try:
                os.unlink(tmp, dir_fd=fd)
            except FileNotFoundError:
                pass
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, 0o700, dir_fd=fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view):]
                os.fsync(out)
                if uid != self._uid:
                    os.fchown(out, uid, _gid_of(uid))
                os.fchmod(out, 0o500)
            finally:
                os.close(out)
            os.rename(tmp, actual, src_dir_fd=fd, dst_dir_fd=fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        return str(self.top / str(uid) / "payloads" / actual)

    def payload(self, uid: int, digest: str) -> str:
        """The path of ``uid``'s payload ``digest`` after checking its bytes (AreaError when
        it is missing, changed or not a regular file of ``uid``)."""
        if not isinstance(digest, str) or not SHA256_RE.match(digest):
            raise AreaError(f"payload {digest!r}: expected a sha256 (64 lowercase hex digits)")
        fd = self._dir_fd(uid, ("payloads",), True)
        try:
            self._verify_at(fd, uid, digest)
        finally:
            os.close(fd)
        return str(self.top / str(uid) / "payloads" / digest)

    def delete_payload(self, uid: int, digest: str) -> None:
        self.delete(uid, [self.top / str(uid) / "payloads" / digest], [])
        self._verified.pop((uid, digest), None)

    def _verify_at(self, dir_fd: int, uid: int, digest: str) -> None:
        try:
            fd = os.open(digest, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as ex:
            raise AreaError(f"payload {digest}: {ex.strerror or ex} (upload it first)") from ex
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
                raise AreaError(f"payload {digest}: not a regular file of uid {uid}")
            mark = (info.st_ino, info.st_size, info.st_ctime_ns, info.st_mtime_ns)
            if self._verified.get((uid, digest)) == mark:
                return
            sha = hashlib.sha256()
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                sha.update(chunk)
            if sha.hexdigest() != digest:
                self._verified.pop((uid, digest), None)
                raise AreaError(f"payload {digest}: its contents changed (sha256 is now "
                                f"{sha.hexdigest()}); upload it again")
            self._verified[(uid, digest)] = mark
        finally:
            os.close(fd)

    # -- sandbox files ----------------------------------------------------------------------

    def read(self, uid: int, path: PathLike,
             max_bytes: int) -> Tuple[bytes, int]:
        """At most ``max_bytes`` of the end of the file ``path``, and its size."""
        parts = self._parts(uid, path)
        fd = self._dir_fd(uid, parts[:-1], False)
        try:
            try:
                f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                            | os.O_NONBLOCK, dir_fd=fd)
            except OSError as ex:
                raise AreaError(f"{path}: {ex.strerror or ex}") from ex
        finally:
            os.close(fd)
        try:
            info = os.fstat(f)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
                raise AreaError(f"{path}: not a regular file of uid {uid}")
            start = max(0, info.st_size - max(0, max_bytes))
            os.lseek(f, start, os.SEEK_SET)
            chunks = []
            left = info.st_size - start
            while left > 0:
                chunk = os.read(f, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks), info.st_size
        finally:
            os.close(f)

    def size(self, uid: int, paths: Iterable[PathLike]) -> int:
        """The bytes of the regular files among ``paths`` (missing ones count 0)."""
        total = 0
        for path in paths:
            try:
                parts = self._parts(uid, path)
                fd = self._dir_fd(uid, parts[:-1], False)
            except (AreaError, OSError):
                continue
            try:
                info = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
                if stat.S_ISREG(info.st_mode):
                    total += info.st_size
            except OSError:
                pass
            finally:
                os.close(fd)
        return total

    def delete(self, uid: int, paths: Iterable[PathLike],
               dirs: Iterable[PathLike]) -> None:
        """Remove the files ``paths`` and the folders ``dirs`` with all they hold (links
        are removed, never followed); missing ones are fine."""
        for path in paths:
            parts = self._parts(uid, path)
            try:
                fd = self._dir_fd(uid, parts[:-1], False)
            except (AreaError, OSError):
                continue
            try:
                os.unlink(parts[-1], dir_fd=fd)
            except FileNotFoundError:
                pass
            finally:
                os.close(fd)
        for path in dirs:
            parts = self._parts(uid, path)
            try:
                fd = self._dir_fd(uid, parts[:-1], False)
            except (AreaError, OSError):
                continue
            try:
                _remove_tree(fd, parts[-1])
            finally:
                os.close(fd)


def _remove_tree(parent: int, name: str) -> None:
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return
    except OSError as ex:
        if ex.errno in (errno.ENOTDIR, errno.ELOOP):
            os.unlink(name, dir_fd=parent)
            return
        raise
    try:
        for child in os.listdir(fd):
            try:
                os.unlink(child, dir_fd=fd)
            except IsADirectoryError:
                _remove_tree(fd, child)
            except PermissionError:
                _remove_tree(fd, child)  # Linux says EISDIR; some systems EPERM
            except FileNotFoundError:
                pass
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent)
    except FileNotFoundError:
        pass


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.match(name) or name in (".", ".."):
        raise AreaError(f"{name!r}: not a file name of a flow area (letters, digits, '_', "
                        f"'.', '-'; at most 128)")


def _gid_of(uid: int) -> int:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid
