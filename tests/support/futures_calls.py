"""Call directories made by hand, as ``FunctionExecutor`` makes them, for the tests of the
compute side (``psij.futures._run``) and of a job's books (``psij.futures._job_calls``)."""

import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from psij.futures import _wire
from psij.futures._payload import call_header, dumps_call
from psij.futures._workdir import WorkDirectory

Call = Tuple[Callable[..., Any], Tuple[Any, ...], Dict[str, Any]]


def call_directory(work: Path, calls: Sequence[Call],
                   headers: Optional[List[Dict[str, Any]]] = None
                   ) -> Tuple[WorkDirectory, str]:
    """A work directory and one call directory holding ``calls``; ``headers[i]`` changes
    fields of call i's header (signed as given)."""
    folder = WorkDirectory(work, "test work directory")
    directory = folder.new_call_directory()
    name = os.path.basename(directory)
    with _wire.open_private(_wire.calls_file(directory)) as out:
        for index, (fn, args, kwargs) in enumerate(calls):
            payload, needs = dumps_call("test", fn, args, kwargs)
            header = call_header(f"{name}/{index}", needs, getattr(fn, "__qualname__", "?"))
            if headers is not None and index < len(headers):
                header.update(headers[index])
            out.write(_wire.signed_header(folder.key, header, payload))
            out.write(payload)
    return folder, directory
