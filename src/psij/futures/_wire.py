"""The files a function call travels in, written and read alike by the client and the compute
side: names, the signed header, private writes.

A call directory (0700, in the work directory) holds one job's calls, numbered from 0:
``calls.in`` (every call's function and arguments, one record after the other), ``c<i>.out``
(call i's result), ``c<i>.claim`` (made with ``O_EXCL`` by whichever side gets there first:
the runner before it runs the call, or the client's ``cancel()``; its content says which) and
the job's ``stdout`` and ``stderr``. The work directory holds ``key``: 32 random bytes (0600)
that sign every record. Files are made new (``O_EXCL``, never through a link), 0600.

A record is one line of JSON (the header), then the pickle bytes. The header says which Python
(major.minor) and cloudpickle version wrote it, which call it belongs to (so a result cannot
be moved to another call), the payload's size (a file cut short says so) and its signature:
HMAC-SHA256 with the key over the header (keys sorted, without ``mac``), a newline and the
pickle bytes. Nothing is unpickled before its signature and versions were checked.

Standard library only, and only light modules: the compute side imports this file for each
job (see ``_run``); it must not import psij's other modules or cloudpickle.
"""

import hashlib
import hmac
import json
import os
import sys
from typing import Any, BinaryIO, Dict, Optional, Tuple

__all__ = ["CALLS_NAME", "CLAIM_CANCEL", "CLAIM_RUN", "FORMAT", "HEADER_LIMIT", "KEY_NAME",
           "WireError", "calls_file", "claim", "claim_file", "open_private", "open_signed",
           "python_version", "read_file", "read_header", "read_key", "read_record", "read_signed",
           "result_file", "signed_header", "write_signed"]

FORMAT = 1
"""The version of this layout, in every header."""
KEY_NAME = "key"
CALLS_NAME = "calls.in"
HEADER_LIMIT = 1 << 20
"""The longest header line read (a header holds names and a traceback's text at most)."""
CLAIM_RUN = b"run"
CLAIM_CANCEL = b"cancel"


class WireError(Exception):
    """A call or result file that is missing, unreadable, unsigned or signed by another key.
    ``aligned``: the next record can still be read (only this one is bad)."""

    def __init__(self, message: str, aligned: bool = False) -> None:
        super().__init__(message)
        self.aligned = aligned


def python_version() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def calls_file(directory: str) -> str:
    return os.path.join(directory, CALLS_NAME)


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


def signed_header(key: bytes, header: Dict[str, Any], payload: bytes) -> bytes:
    """The header line (with the payload's size and the signature) to write before
    ``payload``."""
    fields = dict(header, size=len(payload))
    return _canonical(dict(fields, mac=_mac(key, fields, payload))) + b"\n"


def open_private(path: str) -> BinaryIO:
    """A new file (0600) for writing, refused if anything is at ``path`` already."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    return os.fdopen(fd, "wb")


def write_signed(path: str, key: bytes, header: Dict[str, Any], payload: bytes) -> None:
    """Write ``path`` (new, 0600) as one signed record: header line, then ``payload``, under
    another name first (``<path>.part``), renamed when whole: a reader that finds ``path``
    finds all of it, and a writer that dies half-way leaves no ``path``."""
    part = path + ".part"
    with open_private(part) as out:
        out.write(signed_header(key, header, payload))
        out.write(payload)
    os.rename(part, path)


def open_signed(path: str) -> BinaryIO:
    """``path`` opened for :func:`read_signed` (not followed if it is a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise WireError(f"{path}: missing") from None
    except OSError as ex:
        raise WireError(f"{path}: cannot be read: {ex.strerror or ex}") from ex
    return os.fdopen(fd, "rb")


def read_header(stream: BinaryIO, path: str) -> Optional[Dict[str, Any]]:
    """The next record's header as written (signature unchecked), None at the end."""
    line = stream.readline(HEADER_LIMIT)
    if not line:
        return None
    if not line.endswith(b"\n"):
        raise WireError(f"{path}: no header line (the file is cut short or not ours)")
    try:
        header = json.loads(line)
    except ValueError:
        raise WireError(f"{path}: the header is not JSON (the file was changed or is not "
                        f"ours)") from None
    if not isinstance(header, dict) or not isinstance(header.get("mac"), str) \
            or not isinstance(header.get("size"), int) or header["size"] < 0:
        raise WireError(f"{path}: the header has no signature or size")
    return header


def read_signed(stream: BinaryIO, path: str, key: bytes, call: Optional[str] = None
                ) -> Tuple[Dict[str, Any], bytes]:
    """The next record of ``stream`` (read from ``path``): its header and payload, once its
    signature was checked (and, with ``call``, that it belongs to that call);
    :class:`WireError` saying what is wrong otherwise. Nothing is unpickled here."""
    record = read_record(stream, path, key, call)
    if record is None:
        raise WireError(f"{path}: empty (the job ended while writing it, or it was emptied)")
    return record


def read_record(stream: BinaryIO, path: str, key: bytes, call: Optional[str] = None
                ) -> Optional[Tuple[Dict[str, Any], bytes]]:
    """:func:`read_signed`, but None at the end of ``stream``."""
    header = read_header(stream, path)
    if header is None:
        return None
    payload = stream.read(header["size"])
    if len(payload) != header["size"]:
        raise WireError(f"{path}: cut short ({len(payload)} of {header['size']} bytes; the "
                        f"job ended while writing it, or the file was changed)")
    mac = header.pop("mac")
    if not hmac.compare_digest(mac, _mac(key, header, payload)):
        raise WireError(f"{path}: its signature does not match (the file was changed after "
                        f"it was written, or written with another key); it is not unpickled",
                        aligned=True)
    if call is not None and header.get("call") != call:
        raise WireError(f"{path}: signed for call {header.get('call')!r}, not {call!r}",
                        aligned=True)
    if header.get("format") != FORMAT:
        raise WireError(f"{path}: written in layout {header.get('format')!r}, this side "
                        f"reads layout {FORMAT}", aligned=True)
    return header, payload


def read_file(path: str, key: bytes, call: str) -> Tuple[Dict[str, Any], bytes]:
    """The one record of a result file, checked as :func:`read_signed` does."""
    with open_signed(path) as stream:
        return read_signed(stream, path, key, call)
