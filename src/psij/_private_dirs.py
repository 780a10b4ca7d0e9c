"""The one check of directories psij keeps its own files in: work directories, deployed
launcher scripts, journals, spools.

psij writes scripts there that jobs later run, and journals that a restarted process replays,
so whoever can write in such a directory can run commands as the job's owner. A directory is
accepted only when it is a real directory (not a symbolic link), owned by the effective user
of this process, and not writable by group or others; anything else is refused with
:class:`UnsafePathError`, which names the path, what is wrong and what is accepted. The same
holds for root: a directory owned by another user is refused even though root could write in
it, because that user can change what root would run.

Missing directories are created one level at a time with mode 0700. Only the given directory
(and, with ``within``, every level from ``within`` down to it) is checked, never the folders
above it, so a work directory under ``/tmp`` or a group's project folder is fine as long as the
directory itself is private.

Standard library only: ``batch_test_tool`` loads this file by path under ``python -S``.
Nothing here starts processes or writes files.
"""

import os
import stat
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

__all__ = ["UnsafePathError", "check_private_dir", "check_private_file",
           "check_private_paths", "ensure_private_dir"]

_ACCEPTED_DIR = ("psij only uses a directory that is owned by you ({you}), is not a symbolic "
                 "link and is not writable by group or others")
_ACCEPTED_FILE = ("psij only uses a file there that is a regular file owned by you ({you}) "
                  "and not writable by group or others")


class UnsafePathError(PermissionError):
    """A directory (or a file in one) that others could change; the message says why."""


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name}, uid {uid}"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _problem(st: os.stat_result, path: str, want_dir: bool) -> Optional[str]:
    """What is wrong with an lstat result, or None."""
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"is a symbolic link (to {target!r})"
    if want_dir and not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if not want_dir and not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"is owned by {_user(st.st_uid)}, not by you"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}; "
                f"'chmod go-w' it if that is not wanted)")
    return None


def _usable(name: str, what: str) -> None:
    """ValueError naming the path when the system cannot be given it at all."""
    try:
        encoded = os.fsencode(name)
    except UnicodeEncodeError as ex:
        raise ValueError(f"{what} {name!r}: cannot be a file name here ({ex.reason}); "
                         f"accepted: a path the file system encoding can represent") from None
    if b"\0" in encoded:
        raise ValueError(f"{what} {name!r}: contains a NUL character, which no path may hold")


def _check(path: Union[str, Path], what: str, want_dir: bool) -> None:
    name = os.fspath(path)
    _usable(name, what)
    _check_usable(name, what, want_dir)


def _check_usable(name: str, what: str, want_dir: bool) -> None:
    try:
        st = os.lstat(name)
    except OSError as ex:
        raise type(ex)(f"{what} {name}: cannot be examined: {ex.strerror or ex}") from ex
    problem = _problem(st, name, want_dir)
    if problem is not None:
        accepted = (_ACCEPTED_DIR if want_dir else _ACCEPTED_FILE).format(
            you=_user(os.geteuid()))
        raise UnsafePathError(f"{what} {name}: {problem}; {accepted}")


def check_private_dir(path: Union[str, Path], what: str) -> None:
    """Raise :class:`UnsafePathError` unless ``path`` is a private directory (see above).

    ``what`` names the directory's role in the message, e.g. ``"work directory"``.
    """
    _check(path, what, True)


def check_private_file(path: Union[str, Path], what: str) -> None:
    """Raise :class:`UnsafePathError` unless ``path`` is a regular file owned by this user
    and not writable by group or others (not followed if it is a symbolic link)."""
    _check(path, what, False)


def check_private_paths(checks: Sequence[Tuple[str, str, bool]]) -> None:
    """Check each ``(path, what, is_directory)`` in turn, as :func:`check_private_dir` (when
    ``is_directory``) or :func:`check_private_file` would. For paths checked again and again:
    each path must be a string these functions accepted before (it is not validated again,
    only examined)."""
    for name, what, want_dir in checks:
        _check_usable(name, what, want_dir)


def ensure_private_dir(path: Union[str, Path], what: str,
                       within: Union[str, Path, None] = None) -> Path:
    """Create ``path`` if it is missing (each missing level 0700), check it and return it.

    With ``within`` (an ancestor of ``path``), every directory from ``within`` down to
    ``path`` is checked, so that nothing between a verified work directory and the folder
    used in it is someone else's. The path is made absolute but symbolic links in it are not
    resolved.
    """
    _usable(os.fspath(path), what)
    if within is not None:
        _usable(os.fspath(within), what)
    target = Path(os.path.abspath(path))
    top = target if within is None else Path(os.path.abspath(within))
    levels = [target, *target.parents]
    if top not in levels:
        raise ValueError(f"{what} {target}: is not inside {top}")
    split = levels.index(top) + 1
    above = []  # missing folders above the checked ones
    for level in levels[split:]:
        if os.path.lexists(level):
            break
        above.append(level)
    for level in reversed(above):
        _make(level, target, what)
    # Top down, each level is checked before anything is made in it.
    for level in reversed(levels[:split]):
        if not os.path.lexists(level):
            _make(level, target, what)
        check_private_dir(level, what if level == target else f"{what} {target} is inside")
    return target


def _make(level: Path, target: Path, what: str) -> None:
    try:
        os.mkdir(level, 0o700)
    except FileExistsError:
        pass  # made meanwhile, by us or by someone else: the check tells
    except OSError as ex:
        raise type(ex)(f"{what} {target}: cannot create {level}: {ex.strerror or ex}") from ex
