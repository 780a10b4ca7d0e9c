"""The compute side of a function job: ``python -m psij.futures._run CALL_DIRECTORY``.

Runs the calls of one call directory (see ``_wire``) in order, in this one interpreter, and
writes each one's signed result file: the value, or the exception the function raised with its
traceback's text, or why the call could not be run (a Python or cloudpickle version other than
the client's, a call file that is missing or not signed by the work directory's key, a value
that cannot be pickled). A call whose claim file the client made first (it was cancelled) is
skipped; so is one with a result, written by an earlier run of the same job (a job run again,
``psij.requeue`` or ``psij.retry``), whose calls cut short without a result run again. Exits 0
when every call was dealt with; a crash of the interpreter leaves the calls
after it without a result, which the client reports with the job's end.

It must stay light, since it starts once per job: it imports ``_wire`` and the standard
library's ``pickle`` only, and cloudpickle only when a payload refers to it or a value needs
it; never psij's other modules.
"""

import os
import pickle
import sys
from typing import Any, Dict, List, Optional, Tuple

from psij.futures import _wire

__all__ = ["main", "run_directory"]


def _cloudpickle_version() -> Optional[str]:
    try:
        import cloudpickle
    except ImportError:
        return None
    return str(cloudpickle.__version__)


def _dumps(value: Any) -> bytes:
    """``value`` pickled; through cloudpickle only when plain pickle cannot (a lambda, a
    class made in the function)."""
    try:
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except Exception:
        import cloudpickle

        return bytes(cloudpickle.dumps(value, pickle.HIGHEST_PROTOCOL))


def _type_name(ex: BaseException) -> str:
    cls = type(ex)
    return f"{cls.__module__}.{cls.__qualname__}"


def _safe_text(value: object) -> str:
    try:
        return str(value)
    except Exception as ex:  # a __str__ that raises
        return f"<cannot be shown: {type(ex).__name__}>"


def _version_problem(header: Dict[str, Any]) -> Optional[str]:
    here = _wire.python_version()
    if header.get("python") != here:
        return (f"the call was serialized by Python {header.get('python')} but the compute "
                f"side runs Python {here} ({sys.executable}); use the same Python major.minor "
                f"on both sides (FunctionExecutor(python=...))")
    wanted = header.get("cloudpickle")
    if header.get("needs_cloudpickle") and wanted is not None:
        found = _cloudpickle_version()
        if found is None:
            return (f"the call needs cloudpickle {wanted}, which is not installed for "
                    f"{sys.executable} on the compute side")
        if found != wanted:
            return (f"the call was serialized with cloudpickle {wanted} but the compute side "
                    f"has cloudpickle {found} ({sys.executable}); install the same version "
                    f"on both sides")
    return None


def _outcome(header: Dict[str, Any], payload: bytes) -> Tuple[Dict[str, Any], bytes]:
    """Run one verified call: the result header's fields and its payload."""
    problem = _version_problem(header)
    if problem is not None:
        return {"outcome": "error", "message": problem}, b""
    try:
        fn, args, kwargs = pickle.loads(payload)
    except Exception as ex:
        return {"outcome": "error", "message": f"the call cannot be unpickled on the compute "
                f"side: {_type_name(ex)}: {_safe_text(ex)}"}, b""
    try:
        value = fn(*args, **kwargs)
    except BaseException as ex:  # the function's own SystemExit or KeyboardInterrupt too
        return _raised(ex)
    try:
        return {"outcome": "value"}, _dumps(value)
    except Exception as ex:
        return {"outcome": "error", "message": f"the function returned a value that cannot be "
                f"pickled ({type(value).__module__}.{type(value).__qualname__}): "
                f"{_type_name(ex)}: {_safe_text(ex)}"}, b""


def _raised(ex: BaseException) -> Tuple[Dict[str, Any], bytes]:
    import traceback

    # The runner's own frame is left out: the traceback starts in the function.
    tb = ex.__traceback__.tb_next if ex.__traceback__ is not None else None
    text = "".join(traceback.format_exception(type(ex), ex, tb))
    fields = {"outcome": "raised", "type": _type_name(ex), "message": _safe_text(ex),
              "traceback": text}
    try:
        payload = _dumps(ex)
        pickle.loads(payload)  # an exception whose pickle cannot be loaded back is sent as text
    except Exception:
        payload = b""
    return fields, payload


def _result(directory: str, key: bytes, index: int, fields: Dict[str, Any],
            payload: bytes) -> None:
    loaded = sys.modules.get("cloudpickle")
    fields.update({"format": _wire.FORMAT, "call": f"{os.path.basename(directory)}/{index}",
                   "python": _wire.python_version(),
                   "cloudpickle": None if loaded is None else loaded.__version__})
    _wire.write_signed(_wire.result_file(directory, index), key, fields, payload)
    sys.stdout.flush()
    sys.stderr.flush()


def _cut_short(directory: str, index: int) -> bool:
    """Whether call ``index`` was started by an earlier run of this job that ended before
    writing its result (killed for its memory or time limit, its node lost): in a job run
    again (``psij.requeue``, ``psij.retry``: ``PSIJ_ATTEMPT`` above 1; or requeued by Slurm
    itself: ``SLURM_RESTART_COUNT`` above 0) this run runs the call again. A call the client
    claimed (cancelled) or one with a result stays as it is; in a first run a claimed call is
    another runner's."""
    if os.environ.get("PSIJ_ATTEMPT", "1") in ("", "1") \
            and os.environ.get("SLURM_RESTART_COUNT", "0") in ("", "0"):
        return False
    if os.path.lexists(_wire.result_file(directory, index)):
        return False
    try:
        fd = os.open(_wire.claim_file(directory, index), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return os.read(fd, 64) == _wire.CLAIM_RUN
    finally:
        os.close(fd)


def run_directory(directory: str) -> int:
    """Run the calls of ``directory``; the number run (skipped ones not counted)."""
    directory = os.path.abspath(directory)
    key = _wire.read_key(os.path.dirname(directory))
    name = os.path.basename(directory)
    path = _wire.calls_file(directory)
    done = 0
    index = 0
    with _wire.open_signed(path) as calls:
        while True:
            fields: Dict[str, Any]
            aligned = True
            try:
                record = _wire.read_record(calls, path, key, f"{name}/{index}")
                if record is None:
                    break
                fields, payload = {}, b""
            except _wire.WireError as ex:
                record, aligned = None, ex.aligned
                fields, payload = {"outcome": "error", "message": str(ex)}, b""
            if _wire.claim(directory, index, _wire.CLAIM_RUN) \
                    or _cut_short(directory, index):
                if record is not None:
                    fields, payload = _outcome(*record)
                _result(directory, key, index, fields, payload)
                done += 1
            if not aligned:
                break  # the calls after a broken header cannot be found: they get none
            index += 1
    return done


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m psij.futures._run CALL_DIRECTORY\n")
        return 2
    try:
        run_directory(args[0])
    except (OSError, _wire.WireError) as ex:
        sys.stderr.write(f"psij.futures._run: {ex}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
