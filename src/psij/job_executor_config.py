"""Configuration shared by all executors: where work files go and where launchers log."""

from pathlib import Path
from typing import Any, ClassVar, Union

from psij import _check

__all__ = ["JobExecutorConfig"]


class JobExecutorConfig:
    """Executor configuration; ``work_directory`` defaults to ``~/.psij/work``."""

    DEFAULT: "ClassVar[JobExecutorConfig]"

    def __init__(self, launcher_log_file: Union[str, Path, None] = None,
                 work_directory: Union[str, Path, None] = None) -> None:
        self.launcher_log_file = _check.opt_path("JobExecutorConfig.launcher_log_file",
                                                 launcher_log_file)
        wd = _check.opt_path("JobExecutorConfig.work_directory", work_directory)
        self.work_directory: Path = wd if wd is not None else Path.home() / ".psij" / "work"

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("launcher_log_file", "work_directory"):
            value = _check.opt_path(f"JobExecutorConfig.{name}", value)
            if value is None and name == "work_directory":
                raise _check.fail_type("JobExecutorConfig.work_directory", value,
                                       "str or pathlib.Path")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(launcher_log_file={self.launcher_log_file!r}, "
                f"work_directory={self.work_directory!r})")


JobExecutorConfig.DEFAULT = JobExecutorConfig()
