"""The strings of a job that no process or file name can receive, refused before anything is
held, written or started.

Such a string holds a lone surrogate that has no byte form: ``"\\ud800"``. A surrogate that
stands for an undecodable byte (``"\\udcff"``, as ``os.fsdecode`` makes from the byte 0xff) is
accepted, and reaches the process as that byte, as ``os.fsencode`` gives it.

:func:`spec_texts` lists the strings of a JobSpec that reach the job's processes (executable,
arguments, environment names and values, directory, standard stream paths, pre- and
post-launch scripts); an executor adds its own (a batch script's job name and directives) and
:func:`check_texts` refuses the first one that cannot be encoded, with an
InvalidJobException naming its field. Pure: nothing here reads files or starts processes.
"""

from pathlib import Path
from typing import Iterable, List, Tuple, Union

from psij import _check
from psij.exceptions import InvalidJobException
from psij.job_spec import JobSpec

__all__ = ["check_texts", "spec_texts"]

Texts = List[Tuple[str, Union[str, Path, None]]]
_PATH_FIELDS = ("directory", "stdin_path", "stdout_path", "stderr_path", "pre_launch",
                "post_launch")


def spec_texts(spec: JobSpec) -> Texts:
    """(field, value) for each string of ``spec`` that reaches the job's processes."""
    texts: Texts = [("JobSpec.executable", spec.executable)]
    texts += [(f"JobSpec.arguments[{i}]", a) for i, a in enumerate(spec.arguments or ())]
    for key, value in (spec.environment or {}).items():
        texts += [(f"JobSpec.environment key {key!r}", key),
                  (f"JobSpec.environment[{key!r}]", value)]
    texts += [(f"JobSpec.{field}", getattr(spec, field)) for field in _PATH_FIELDS]
    return texts


def check_texts(texts: Iterable[Tuple[str, Union[str, Path, None]]]) -> None:
    """Refuse, naming its field, the first value that no process can receive."""
    strings = [(field, str(value)) for field, value in texts if value is not None]
    if "".join(value for _, value in strings).isascii():
        return  # the common case, settled at once: ASCII always has an encoding
    for field, value in strings:
        try:
            _check.os_text(field, value)
        except ValueError as ex:
            raise InvalidJobException(str(ex)) from None
