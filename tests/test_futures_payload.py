"""The client's side of call files (``psij.futures._payload``): a call that cannot be pickled
is refused naming the part that cannot, cloudpickle is needed only where a payload refers to
it, and a result is read back as a value, the function's exception or a clear error."""

import os
import threading
from pathlib import Path
from typing import Any, Dict

import pytest

from psij.futures import _wire
from psij.futures._payload import dumps_call, load_result
from psij.futures._workdir import WorkDirectory
from psij.futures.errors import FunctionJobError, FunctionResultError, RemoteException
from support import futures_functions as ff


def test_the_part_that_cannot_be_pickled_is_named() -> None:
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"^map item 4: argument 1 \(_thread.lock\) cannot be "
                                        r"serialized with cloudpickle: TypeError"):
        dumps_call("map item 4", ff.add, (1, lock), {})
    with pytest.raises(TypeError, match="submit: keyword argument 'x'"):
        dumps_call("submit", ff.add, (1,), {"x": (i for i in range(3))})


def test_cloudpickle_is_needed_only_for_what_plain_pickle_cannot_load() -> None:
    assert dumps_call("submit", ff.square, (3,), {})[1] is False
    assert dumps_call("submit", lambda x: x, (3,), {})[1] is True


def written(tmp_path: Path, header: Dict[str, Any], payload: bytes = b"") -> Any:
    work = WorkDirectory(tmp_path / "w", "work")
    path = os.path.join(work.path, "r.out")
    fields = {"format": _wire.FORMAT, "call": "d/0", "python": _wire.python_version()}
    fields.update(header)
    _wire.write_signed(path, work.key, fields, payload)
    return load_result(path, work.key, "d/0", FunctionResultError)


def test_results_read_back_as_values_exceptions_or_errors(tmp_path: Path) -> None:
    import pickle

    assert written(tmp_path / "1", {"outcome": "value"}, pickle.dumps([1, 2])) == (True, [1, 2])
    ok, error = written(tmp_path / "2", {"outcome": "raised", "type": "x.Weird",
                                         "message": "odd", "traceback": "Traceback: here"})
    assert not ok and isinstance(error, RemoteException) and str(error) == "x.Weird: odd"
    assert "Traceback: here" in str(error.__cause__)
    ok, error = written(tmp_path / "3", {"outcome": "error", "message": "no cloudpickle"})
    assert isinstance(error, FunctionJobError) and "no cloudpickle" in str(error)
    ok, error = written(tmp_path / "4", {"outcome": "value", "python": "2.7"},
                        pickle.dumps(1))
    assert isinstance(error, FunctionResultError) and "Python 2.7" in str(error)
    ok, error = written(tmp_path / "5", {"outcome": "value"}, b"not a pickle")
    assert isinstance(error, FunctionResultError) and "cannot be unpickled" in str(error)
