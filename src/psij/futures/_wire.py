"""The files a function call travels in, written and read alike by the client and the compute
side: names, the signed header, private writes.

A call directory (0700, in the work directory) holds one job's calls, numbered from 0:
``c<i>.in`` (the function and its arguments), ``c<i>.out`` (its result), ``c<i>.claim`` (made
with ``O_EXCL`` by whichever side gets there first: the runner before it runs the call, or the
client's ``cancel()``; its content says which) and the job's ``stdout`` and ``stderr``. The
work directory holds ``key``: 32 random bytes (0600) that sign every ``.in`` and ``.out`` file.

A call or result file is one line of JSON (the header), then the pickle bytes. The header says
which Python (major.minor) and cloudpickle version wrote it, which call it belongs to (so a
result cannot be moved to another call) and its signature: HMAC-SHA256 with the key over the
header (keys sorted, without ``mac``), a newline and the pickle bytes. Nothing is unpickled
before its signature and versions were checked.

Standard library only, and only light modules: the compute side imports this file for each
job (see ``_run``); it must not import psij's other modules or cloudpickle.
"""

import hashlib
import hmac
import json
import os
import sys
from typing import Any, BinaryIO, Dict, Optional, Tuple

__all__ = ["CLAIM_CANCEL", "CLAIM_RUN", "FORMAT", "HEADER_LIMIT", "KEY_NAME", "WireError",
           "call_file", "claim", "claim_file", "python_version", "read_key", "read_signed",
           "result_file", "write_signed"]

FORMAT = 1
"""The version of this layout, in every header."""
KEY_NAME = "key"
HEADER_LIMIT = 1 << 20
"""The longest header line read (a header holds names and a traceback's text at most)."""
CLAIM_RUN = b"run"
CLAIM_CANCEL = b"cancel"


class WireError(Exception):
    """A call or result file that is missing, unreadable, unsigned or signed by another key."""


def python_version() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def call_file(directory: str, index: int) -> str:
    return os.path.join(directory, f"c{index}.in")


def result_file(directory: str, index: int) -> str:
    return os.path.join(directory, f"c{index}.out")


def claim_file(directory: str, index: int) -> str:
    return os.path.join(directory, f"c{index}.claim")


def claim(directory: str, index: int, who: bytes) -> bool:
    """Take call ``index`` for ``who``; False when the other side had taken it."""
    try:
        fd = os.open(claim_file(directory, index),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    try:
        os.write(fd, who)
    finally:
        os.close(fd)
    return True


def read_key(work_directory: str) -> bytes:
    """The signing key of a work directory (a regular file of ours, not a link)."""
    path = os.path.join(work_directory, KEY_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as ex:
        raise WireError(f"the signing key {path} cannot be read: {ex.strerror or ex}") from ex
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise WireError(f"the signing key {path} is not private (owner uid {st.st_uid}, "
                            f"mode {st.st_mode & 0o777:04o}); it must be yours and 0600")
        key = os.read(fd, 64)
    finally:
        os.close(fd)
    if len(key) < 32:
        raise WireError(f"the signing key {path} is too short ({len(key)} bytes)")
    return key


def _canonical(header: Dict[str, Any]) -> bytes:
    return json.dumps(header, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True).encode("ascii")


def _mac(key: bytes, header: Dict[str, Any], payload: bytes) -> str:
    signer = hmac.new(key, _canonical(header) + b"\n", hashlib.sha256)
    signer.update(payload)
    return signer.hexdigest()


def write_signed(path: str, key: bytes, header: Dict[str, Any], payload: bytes) -> None:
    """Write ``path`` (0600) as a signed header and ``payload``, through a temporary file
    renamed into place, so a reader sees the whole file or none."""
    signed = dict(header, mac=_mac(key, header, payload))
    temporary = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(_canonical(signed) + b"\n")
            out.write(payload)
        os.rename(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def _read_header(stream: BinaryIO, path: str) -> Dict[str, Any]:
    line = stream.readline(HEADER_LIMIT)
    if not line.endswith(b"\n"):
        raise WireError(f"{path}: no header line (the file is cut short or not ours)")
    try:
        header = json.loads(line)
    except ValueError:
        raise WireError(f"{path}: the header is not JSON (the file was changed or is not "
                        f"ours)") from None
    if not isinstance(header, dict) or not isinstance(header.get("mac"), str):
        raise WireError(f"{path}: the header has no signature")
    return header


def read_signed(path: str, key: bytes, call: Optional[str] = None
                ) -> Tuple[Dict[str, Any], bytes]:
    """The header and payload of ``path``, once its signature was checked (and, with
    ``call``, that it belongs to that call); :class:`WireError` saying what is wrong
    otherwise. Nothing is unpickled here."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise WireError(f"{path}: missing") from None
    except OSError as ex:
        raise WireError(f"{path}: cannot be read: {ex.strerror or ex}") from ex
    with os.fdopen(fd, "rb") as stream:
        header = _read_header(stream, path)
        payload = stream.read()
    mac = header.pop("mac")
    if not hmac.compare_digest(mac, _mac(key, header, payload)):
        raise WireError(f"{path}: its signature does not match (the file was changed after "
                        f"it was written, or written with another key); it is not unpickled")
    if call is not None and header.get("call") != call:
        raise WireError(f"{path}: signed for call {header.get('call')!r}, not {call!r}")
    if header.get("format") != FORMAT:
        raise WireError(f"{path}: written in layout {header.get('format')!r}, this side "
                        f"reads layout {FORMAT}")
    return header, payload
