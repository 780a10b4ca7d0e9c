"""Launchers that start a job through a bash script shipped in ``launchers/``.

The script and the shared ``launcher_lib.sh`` are copied ("deployed") into
``<work_directory>/launchers/<checksum>/``, a folder named after the content of the files, so that
jobs keep working while another version of psij deploys different scripts next to them. A folder
appears complete or not at all: it is written under a temporary name and renamed into place, so
any number of processes may deploy at once without locks. Each process deploys a given set of
files at most once per work directory.

Jobs run these scripts, so they are kept only in private folders (see ``psij._private_dirs``):
the work directory, ``launchers/`` and the deployed folder must be owned by this user and not
writable by others, and the deployed files too; anything else is refused with
``UnsafePathError`` (a :class:`PermissionError`). A folder found in the cache of deployed folders is
checked again on every use, so a folder that changed hands since is not trusted.

This module builds argument lists and reads the launcher's output; it never starts processes
(executors do) and never passes anything through a shell command line.
"""

import errno
import importlib
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

from psij._data import data_dir
from psij._private_dirs import (
    UnsafePathError,
    check_private_dir,
    check_private_file,
    check_private_paths,
    ensure_private_dir,
)
from psij._reexports import lazy_names
from psij.exceptions import InvalidJobException
from psij.job_executor_config import JobExecutorConfig
from psij.job_launcher import Launcher

if TYPE_CHECKING:
    from psij.job import Job

__all__ = ["LAUNCHER_DONE_MARKER", "ScriptBasedLauncher", "deploy_files"]

LAUNCHER_DONE_MARKER = "_PSI_J_LAUNCHER_DONE"
"""The line a launcher script prints last when it ran the job (whatever the job's exit status)."""

_FAILURE_MESSAGE_LIMIT = 2000
_DEPLOY_ATTEMPTS = 3
_CHECKSUM_LENGTH = 32

_deployed: Dict[Tuple[str, str], Path] = {}
_deployed_lock = threading.Lock()


def _sha256() -> Any:
    """A new SHA-256 hash: from the interpreter's own module when it has one (importing
    hashlib loads OpenSSL, some 4 ms of a process's first job), else from hashlib."""
    for name in ("_sha2", "_sha256"):  # Python 3.12 and later, then 3.9 to 3.11
        try:
            return importlib.import_module(name).sha256()
        except (ImportError, AttributeError):
            continue
    import hashlib

    return hashlib.sha256()


def _checksum(contents: Sequence[Tuple[str, bytes, bool]]) -> str:
    digest = _sha256()
    for name, data, executable in contents:
        encoded = name.encode()
        # Lengths first, so that no two different file lists hash the same byte stream.
        digest.update(len(encoded).to_bytes(8, "big") + encoded)
        digest.update(len(data).to_bytes(8, "big") + data)
        if executable:  # (a length's first byte is never "x")
            digest.update(b"x")
    return str(digest.hexdigest()[:_CHECKSUM_LENGTH])


def _read_contents(files: Sequence[Path]) -> List[Tuple[str, bytes, bool]]:
    """Name, bytes and whether the file is executable (by its owner), for each file."""
    contents: List[Tuple[str, bytes, bool]] = []
    names = set()
    for path in files:
        if path.name in names:
            raise ValueError(f"launcher files to deploy: two files are named {path.name!r} "
                             f"({[str(p) for p in files]}); they would overwrite each other")
        names.add(path.name)
        try:
            data = path.read_bytes()
            contents.append((path.name, data, bool(path.stat().st_mode & stat.S_IXUSR)))
        except OSError as e:
            raise FileNotFoundError(f"launcher file {path} cannot be read: {e}") from e
    return contents


def _holds(folder: Path, contents: Sequence[Tuple[str, bytes, bool]]) -> bool:
    try:
        return all((folder / name).read_bytes() == data
                   and bool((folder / name).stat().st_mode & stat.S_IXUSR) == executable
                   for name, data, executable in contents)
    except OSError:
        return False


def _write_temporary_folder(root: Path, contents: Sequence[Tuple[str, bytes, bool]]) -> Path:
    temporary = Path(tempfile.mkdtemp(prefix=".deploying-", dir=root))
    try:
        for name, data, executable in contents:
            # The scripts are run as "bash <script>"; a file deployed with them that the
            # launcher runs directly (psij-python's test launcher runs a "hostname" script)
            # keeps its executable bit, as psij-python keeps a deployed file's mode.
            fd = os.open(temporary / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                         0o700 if executable else 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return temporary


def _deployed_checks(work_directory: Path, folder: Path,
                     names: Sequence[str]) -> List[Tuple[str, str, bool]]:
    """The checks (for ``check_private_paths``) that the deployed ``folder`` and everything
    above it up to the work directory, and its files, are private to this user."""
    levels = [folder.parent]
    if work_directory in folder.parents:
        levels = [p for p in folder.parents if p == work_directory or work_directory in p.parents]
    checks = [(str(level), f"launcher scripts folder {folder} is inside", True)
              for level in reversed(levels)]
    checks.append((str(folder), "launcher scripts folder", True))
    checks.extend((str(folder / name), "deployed launcher file", False) for name in names)
    return checks


def _check_deployed(work_directory: Path, folder: Path, names: Sequence[str]) -> None:
    """Raise UnsafePathError unless the deployed ``folder`` and everything above it up to the
    work directory, and its files, are private to this user."""
    for name, what, is_dir in _deployed_checks(work_directory, folder, names):
        (check_private_dir if is_dir else check_private_file)(name, what)


def _move_aside(folder: Path) -> None:
    """Takes a deployed folder whose files were changed out of the way."""
    import secrets  # only here (rare): it costs each process's first job ~1 ms to import

    stale = folder.with_name(f".stale-{folder.name}-{secrets.token_hex(4)}")
    try:
        os.rename(folder, stale)
    except FileNotFoundError:
        return  # another process got there first
    shutil.rmtree(stale, ignore_errors=True)


def deploy_files(work_directory: Path, files: Sequence[Path]) -> Path:
    """Copies ``files`` into ``<work_directory>/launchers/<checksum>/`` and returns that folder.

    The checksum covers the names, order, contents and executable bits of the files (a file
    executable by its owner is deployed 0700, others 0600). An existing folder is
    reused when its files are byte-for-byte the same; one whose files were edited is replaced.
    """
    contents = _read_contents(files)
    names = [name for name, _, _ in contents]
    checksum = _checksum(contents)
    base = Path(os.path.abspath(work_directory))
    root = base / "launchers"
    key = (str(root), checksum)
    with _deployed_lock:
        done = _deployed.get(key)
        if done is not None:
            try:
                _check_deployed(base, done, names)
                return done
            except FileNotFoundError:
                del _deployed[key]  # removed meanwhile: deploy again
        ensure_private_dir(root, "launcher scripts folder", within=base)
        target = root / checksum
        for _ in range(_DEPLOY_ATTEMPTS):
            if os.path.lexists(target):
                # A symbolic link or another user's folder is refused, never replaced.
                _check_deployed(base, target, [])
                if _holds(target, contents):
                    try:
                        _check_deployed(base, target, names)
                        _deployed[key] = target
                        return target
                    except UnsafePathError:
                        pass  # our folder, but a file in it others may write: replace it
                _move_aside(target)
            temporary = _write_temporary_folder(root, contents)
            try:
                os.rename(temporary, target)
            except OSError as e:
                shutil.rmtree(temporary, ignore_errors=True)
                # EEXIST/ENOTEMPTY: another process renamed its copy into place first.
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                continue
            _deployed[key] = target
            return target
        raise OSError(f"could not deploy launcher files to {target}: the folder kept changing "
                      f"while it was being written ({_DEPLOY_ATTEMPTS} attempts)")


def _word(value: Union[str, Path, None], default: str) -> str:
    return default if value is None else str(value)


class ScriptBasedLauncher(Launcher):
    """A launcher that runs the job through a bash script.

    The launch command is ``bash <deployed script> <job id> <log file|''> <pre-launch|''>
    <post-launch|''> <stdin> <stdout> <stderr> [get_additional_args(job)...] <executable>
    [arguments...]``, where missing streams are ``/dev/null``. Relative paths are kept as given:
    the script runs in the job's directory. The script sources ``launcher_lib.sh`` (deployed next
    to it) and prints ``_PSI_J_LAUNCHER_DONE`` as its last line once the job has run; any other
    ending is a launcher failure. Subclasses pass extra script arguments through
    :meth:`get_additional_args` and extra files through :meth:`_files_to_deploy`.
    """

    def __init__(self, script_path: Union[str, Path],
                 config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(config)
        if not isinstance(script_path, (str, Path)):
            raise TypeError(f"ScriptBasedLauncher.script_path: expected str or pathlib.Path, got "
                            f"{script_path!r} ({type(script_path).__name__})")
        self._script_path = Path(script_path)
        self._deploy_lock = threading.Lock()
        self._deployed_script: Optional[Path] = None
        # What each use checks again: ((script, file names, work directory), the checks).
        self._deployed_checks: Optional[Tuple[Tuple[Path, Tuple[str, ...], Any],
                                              List[Tuple[str, str, bool]]]] = None

    def _files_to_deploy(self) -> List[Path]:
        """The files copied into the deployment folder; the script must be among them."""
        return [data_dir("launchers") / "launcher_lib.sh", self._script_path]

    def _deploy_files(self, paths: List[Path]) -> Path:
        """Deploys ``paths`` into the work directory and returns their folder."""
        return deploy_files(self.config.work_directory, paths)

    def _ensure_deployed(self) -> Path:
        with self._deploy_lock:
            files = self._files_to_deploy()
            script = self._deployed_script
            if script is not None:
                names = tuple(p.name for p in files)
                try:
                    self._check_again(script, names)
                    return script
                except FileNotFoundError:
                    self._deployed_script = None  # removed meanwhile: deploy again
            folder = self._deploy_files(files)
            self._deployed_script = folder / self._script_path.name
            return self._deployed_script

    def _check_again(self, script: Path, names: Tuple[str, ...]) -> None:
        """Check the deployed folder of ``script`` (see :func:`_check_deployed`) before it is
        used again; which paths to examine is worked out once."""
        key = (script, names, self.config.work_directory)
        known = self._deployed_checks
        if known is not None and known[0][0] is key[0] and known[0][1] == names \
                and known[0][2] is key[2]:
            check_private_paths(known[1])
            return
        work_directory = Path(os.path.abspath(key[2]))
        _check_deployed(work_directory, script.parent, names)
        self._deployed_checks = (key, _deployed_checks(work_directory, script.parent, names))

    def get_launch_command(self, job: "Job",
                           log_file: Union[str, Path, None] = None) -> List[str]:
        """The argv that runs ``job`` through the script; ``log_file`` defaults to the config's.

        The log file is made absolute here, since the script runs in the job's directory.
        """
        spec = job.spec
        if spec is None:
            raise InvalidJobException(f"job {job.id}: has no JobSpec, so there is nothing to "
                                      f"launch")
        if spec.executable is None:
            raise InvalidJobException(f"job {job.id}: JobSpec.executable is not set; a launcher "
                                      f"needs a program to run")
        script = self._ensure_deployed()
        if log_file is None:
            log_file = self.config.launcher_log_file
        log_word = "" if log_file is None or str(log_file) == "" else os.path.abspath(log_file)
        return [
            "bash", str(script), job.id, log_word,
            _word(spec.pre_launch, ""), _word(spec.post_launch, ""),
            _word(spec.stdin_path, "/dev/null"), _word(spec.stdout_path, "/dev/null"),
            _word(spec.stderr_path, "/dev/null"),
            *self.get_additional_args(job),
            spec.executable, *(spec.arguments or []),
        ]

    def get_additional_args(self, job: "Job") -> List[str]:
        """Script-specific arguments placed between the streams and the executable."""
        return []

    def is_launcher_failure(self, output: str) -> bool:
        """True unless the last non-blank line of the launcher's output is the done marker."""
        last_line = output.rstrip().rpartition("\n")[2]
        return last_line.strip() != LAUNCHER_DONE_MARKER

    def get_launcher_failure_message(self, output: str) -> str:
        """The launcher's output without the marker, trimmed to its last 2000 characters."""
        text = "\n".join(line for line in output.splitlines()
                         if line.strip() != LAUNCHER_DONE_MARKER).strip()
        if not text:
            return "the launcher ended without any output and without reporting that the job ran"
        if len(text) > _FAILURE_MESSAGE_LIMIT:
            text = "..." + text[-_FAILURE_MESSAGE_LIMIT:]
        return text


# Names that psij-python's module of the same path also offers (imported there).
if not TYPE_CHECKING:
    __getattr__ = lazy_names(__name__, {
        "Job": "psij.job",
    })
