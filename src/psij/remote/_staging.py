"""Staging over the connection: a remote job's ``stage_in`` sources and ``stage_out`` targets
are paths on the client's machine.

Before the submission the client sends each stage-in source (a file, or a folder with the
files under it) in pieces (``put``) to a private folder of the job on the remote host,
``<work directory>/remote/staging/<job id>/in/<n>/<name>``, and the server rewrites the
entry's source to that copy. Each stage-out target is rewritten on the server to
``.../out/<n>/<name>``: the remote executor stages there when the job ends (with the entry's
flags), and the client brings what is there back to the real target (``get``) before it
enters the job's final state, then drops the job's folder (``drop``). Every request names a
job, an entry and an offset, so one sent again after a dropped connection does the same.
"""

import base64
import os
import shutil
from copy import copy
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from psij._private_dirs import ensure_private_dir
from psij.exceptions import InvalidJobException
from psij.job_spec import JobSpec
from psij.remote._protocol import PIECE
from psij.remote._protocol import job_id as job_id_of
from psij.staging import URI, StageIn, StageOut

Call = Callable[[str, Dict[str, Any]], Any]


def _part(field: str, value: Any) -> str:
    if (not isinstance(value, str) or not value or value in (".", "..") or "/" in value
            or "\0" in value or len(value) > 255):
        raise ValueError(f"{field}: expected one file name, got {str(value)[:80]!r}")
    return value


def _relative(field: str, value: Any) -> List[str]:
    if not isinstance(value, str) or len(value) > 4096:
        raise ValueError(f"{field}: expected a relative path, got {str(value)[:80]!r}")
    return [_part(field, p) for p in value.split("/")]


def _index(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 100000:
        raise ValueError(f"{field}: expected an entry number, got {value!r}")
    return value


class ServerStaging:
    """The remote side: the job folders under ``<work directory>/remote/staging``."""

    def __init__(self, work_directory: Path) -> None:
        self.root = work_directory / "remote" / "staging"
        self._work = work_directory

    def _job_dir(self, job_id: Any, make: bool) -> Path:
        folder = self.root / job_id_of(job_id)
        if make:
            ensure_private_dir(folder, "remote staging folder", within=self._work)
        return folder

    def put(self, request: Mapping[str, Any]) -> int:
        """Write one piece of a stage-in file; the bytes the file holds now."""
        folder = self._job_dir(request.get("job"), make=True)
        n = _index("n", request.get("n"))
        parts = [str(n), *_relative("path", request.get("path"))]
        offset = request.get("offset")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset: expected a byte count, got {offset!r}")
        data = request.get("data")
        if not isinstance(data, str):
            raise ValueError("data: expected base64 text")
        try:
            content = base64.b64decode(data, validate=True)
        except ValueError as ex:
            raise ValueError(f"data: not base64 ({ex})") from None
        mode = 0o700 if request.get("executable") else 0o600
        parent = ensure_private_dir(folder.joinpath("in", *parts[:-1]), "remote staging folder",
                                    within=folder)
        fd = os.open(parent / parts[-1], os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, mode)
        try:
            if offset == 0:
                os.ftruncate(fd, 0)
            os.pwrite(fd, content, offset)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def rewrite(self, job_id: str, spec: JobSpec) -> JobSpec:
        """``spec`` with its staging entries pointing into the job's folder (the uploaded
        sources must be there)."""
        if not spec.stage_in and not spec.stage_out:
            return spec
        spec = copy(spec)
        folder = self._job_dir(job_id, make=True)
        stage_in = []
        for n, item in enumerate(spec.stage_in or ()):
            name = _part(f"stage_in[{n}] source", Path(item.source.path).name)
            staged = folder / "in" / str(n) / name
            if not staged.exists():
                raise InvalidJobException(f"stage_in[{n}]: {item.source} was not sent to this "
                                          f"host")
            stage_in.append(StageIn(URI(str(staged)), item.target, item.mode))
        stage_out = []
        for n, out in enumerate(spec.stage_out or ()):
            name = _part(f"stage_out[{n}] target", Path(out.target.path).name)
            place = ensure_private_dir(folder / "out" / str(n), "remote staging folder",
                                       within=folder)
            stage_out.append(StageOut(out.source, URI(str(place / name)), out.flags, out.mode))
        spec.stage_in = stage_in
        spec.stage_out = stage_out
        return spec

    def get(self, request: Mapping[str, Any]) -> Dict[str, Any]:
        """What a stage-out entry brought back: without ``path``, the list of its files;
        with it, one piece of that file."""
        folder = self._job_dir(request.get("job"), make=False) / "out"
        n = _index("n", request.get("n"))
        base = folder / str(n)
        path = request.get("path")
        if path is None:
            files = []
            if base.is_dir() and not base.is_symlink():
                for top, _dirs, names in os.walk(base):
                    for name in sorted(names):
                        full = Path(top, name)
                        if full.is_file():
                            files.append({"path": full.relative_to(base).as_posix(),
                                          "size": full.stat().st_size,
                                          "executable": os.access(full, os.X_OK)})
            return {"files": files}
        parts = _relative("path", path)
        if base.is_symlink() or not base.is_dir():
            raise ValueError(f"stage_out[{n}]: nothing was staged out")
        full = base.joinpath(*parts)
        offset = request.get("offset")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset: expected a byte count, got {offset!r}")
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            data = os.pread(fd, PIECE, offset)
        finally:
            os.close(fd)
        return {"data": base64.b64encode(data).decode("ascii")}

    def drop(self, request: Mapping[str, Any]) -> None:
        """Remove the job's folder."""
        folder = self._job_dir(request.get("job"), make=False)
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)


# -- the client's side -------------------------------------------------------------------


def _local_path(what: str, uri: URI) -> Path:
    if uri.scheme != "file" or uri.hostname not in (None, "", "localhost"):
        raise InvalidJobException(f"{what}: {uri} is not a file of this machine; a remote "
                                  f"job stages files between this machine and its host")
    return Path(os.path.abspath(os.path.expanduser(uri.path)))


def _files(source: Path) -> Iterator[Tuple[Path, str]]:
    """Each file to send for ``source`` with its path under the entry's folder."""
    if source.is_dir():
        for top, dirs, names in os.walk(source):
            dirs.sort()
            for name in sorted(names):
                full = Path(top, name)
                if full.is_file():
                    yield full, f"{source.name}/{full.relative_to(source).as_posix()}"
    else:
        yield source, source.name


def send_inputs(call: Call, job_id: str, spec: JobSpec) -> None:
    """Send every stage-in source of ``spec`` to the job's folder on the remote host."""
    for n, item in enumerate(spec.stage_in or ()):
        source = _local_path(f"stage_in[{n}] source", item.source)
        if not source.exists():
            raise InvalidJobException(f"stage_in[{n}]: {source} does not exist")
        for full, relative in _files(source):
            executable = os.access(full, os.X_OK)
            with open(full, "rb") as f:
                offset = 0
                while True:
                    data = f.read(PIECE)
                    if offset and not data:
                        break
                    call("put", {"job": job_id, "n": n, "path": relative, "offset": offset,
                                 "executable": executable,
                                 "data": base64.b64encode(data).decode("ascii")})
                    offset += len(data)
                    if len(data) < PIECE:
                        break


def check_outputs(spec: JobSpec) -> None:
    """InvalidJobException unless every stage-out target is a file of this machine."""
    for n, out in enumerate(spec.stage_out or ()):
        _local_path(f"stage_out[{n}] target", out.target)


def has_outputs(spec: Optional[JobSpec]) -> bool:
    return spec is not None and bool(spec.stage_out)


def fetch_outputs(call: Call, job_id: str, spec: JobSpec) -> List[str]:
    """Bring the job's stage-out files to their targets on this machine; the problems met
    (an empty list when all went well)."""
    problems = []
    for n, out in enumerate(spec.stage_out or ()):
        try:
            target = _local_path(f"stage_out[{n}] target", out.target)
            listing = call("get", {"job": job_id, "n": n})
            files = listing.get("files") if isinstance(listing, dict) else None
            if not isinstance(files, list):
                raise ValueError("the remote host listed no files")
            for entry in files:
                _fetch_one(call, job_id, n, entry, target)
        except Exception as ex:
            problems.append(f"stage_out[{n}] to {out.target}: {ex}")
    return problems


def _fetch_one(call: Call, job_id: str, n: int, entry: Any, target: Path) -> None:
    relative = entry.get("path") if isinstance(entry, dict) else None
    parts = _relative("path", relative)
    size = entry.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"the remote host gave a bad size for {relative!r}")
    # The first part is the staged name: the target takes its place.
    destination = target.joinpath(*parts[1:])
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(f".{destination.name}.psij-part")
    with open(partial, "wb") as f:
        offset = 0
        while offset < size:
            piece = call("get", {"job": job_id, "n": n, "path": relative, "offset": offset})
            data = base64.b64decode(piece["data"], validate=True)
            if not data:
                raise ValueError(f"{relative!r} ended at {offset} of {size} bytes")
            f.write(data)
            offset += len(data)
    if entry.get("executable"):
        # Executable wherever readable: the mode the file was made with already follows the
        # umask (reading the umask would set it for a moment, for every thread).
        mode = os.stat(partial).st_mode & 0o777
        os.chmod(partial, mode | (mode & 0o444) >> 2)
    os.replace(partial, destination)
