"""Submit scripts rendered from Mustache templates.

:class:`TemplatedScriptGenerator` keeps the signature plugins written for the PSI/J Python API
use: ``TemplatedScriptGenerator(config, template_path, escape=...)`` and
``generate_submit_script(job, context, out)``. Every ``{{value}}`` passes through ``escape``
(by default :func:`~psij.executors.batch.escape_functions.bash_escape`, which suits values
placed inside double quotes and launch-command words placed unquoted); ``{{{value}}}`` is never
used by the shipped templates. Partials (``{{> name}}``) are looked up next to the template
first, then among the templates shipped with psij, so plugin templates can reuse the shared
parts. This module renders text; it never writes files other than ``out`` nor runs commands.
"""

from pathlib import Path
from typing import IO, Callable, Dict, List, Optional, Union

import pystache  # type: ignore[import-untyped]

from psij._data import data_dir
from psij.executors.batch.escape_functions import bash_escape
from psij.job import Job
from psij.job_executor_config import JobExecutorConfig

__all__ = ["SubmitScriptGenerator", "TemplatedScriptGenerator"]


class SubmitScriptGenerator:
    """Writes the submit script of a job; subclasses implement :meth:`generate_submit_script`."""

    def __init__(self, config: JobExecutorConfig) -> None:
        self.config = config

    def generate_submit_script(self, job: Job, context: Dict[str, object], out: IO[str]) -> None:
        """Write the submit script of ``job`` to ``out``, using ``context`` (see the batch
        executor's ``_create_script_context``)."""
        raise NotImplementedError


class TemplatedScriptGenerator(SubmitScriptGenerator):
    """Renders a Mustache template (parsed once, at construction)."""

    def __init__(self, config: JobExecutorConfig, template_path: Union[str, Path],
                 escape: Callable[[object], str] = bash_escape) -> None:
        super().__init__(config)
        path = Path(template_path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise FileNotFoundError(f"submit-script template {path} cannot be read: "
                                    f"{e.strerror or e}") from e
        self.template_path = path
        self.escape = escape
        self.template = pystache.parse(text)
        search: List[str] = [str(path.parent)]
        shipped = _shipped_templates()
        if shipped is not None and shipped != path.parent:
            search.append(str(shipped))
        self.renderer = pystache.Renderer(escape=escape, search_dirs=search,
                                          file_extension="mustache", missing_tags="ignore")

    def generate_submit_script(self, job: Job, context: Dict[str, object], out: IO[str]) -> None:
        out.write(self.render(context))

    def render(self, context: Dict[str, object]) -> str:
        """The script text for ``context``."""
        text: str = self.renderer.render(self.template, context)
        return text


def _shipped_templates() -> Optional[Path]:
    try:
        return data_dir("templates")
    except FileNotFoundError:
        return None
