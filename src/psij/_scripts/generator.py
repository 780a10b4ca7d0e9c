"""Job scripts (batch submit scripts, pilot task scripts) rendered from Mustache templates.

:class:`TemplatedScriptGenerator` keeps the signature plugins written for the PSI/J Python API
use: ``TemplatedScriptGenerator(config, template_path, escape=...)`` and
``generate_submit_script(job, context, out)``. Every ``{{value}}`` passes through ``escape``
(by default :func:`~psij._scripts.quoting.bash_escape`, which suits values placed inside
double quotes and launch-command words placed unquoted); ``{{{value}}}`` is never used by the
shipped templates. Partials (``{{> name}}``) are looked up next to the template
first, then among the templates shipped with psij, so plugin templates can reuse the shared
parts. They are read and put in place once, when the generator is made (a standalone tag's
indentation goes before each line of the partial, as Mustache renders it), so rendering a job
reads no file and parses nothing; the parsed template is then rendered by the functions
``psij._scripts.mustache`` makes of it, by pystache's rules. Batch executors, the pilot's
task scripts and plugins (through ``psij._scripts.generator``, which re-exports
this module's names) all render with it. This module renders text; it never writes files other
than ``out`` nor runs commands, and it imports nothing from the executors.
"""

import re
from pathlib import Path
from typing import IO, Callable, Dict, List, Optional, Sequence, Union

import pystache  # type: ignore[import-untyped]

from psij._data import data_dir
from psij._scripts.mustache import NeedsPystache, compile_template
from psij._scripts.quoting import bash_escape
from psij.job import Job
from psij.job_executor_config import JobExecutorConfig

__all__ = ["SubmitScriptGenerator", "TemplatedScriptGenerator", "inline_partials"]


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
        search: List[Path] = [path.parent]
        shipped = _shipped_templates()
        if shipped is not None and shipped != path.parent:
            search.append(shipped)
        self.template = pystache.parse(inline_partials(text, search))
        self.renderer = pystache.Renderer(escape=escape, search_dirs=[str(d) for d in search],
                                          file_extension="mustache", missing_tags="ignore")
        # The same rendering without pystache's per-tag machinery (see .mustache), for as
        # long as the template and the renderer are these.
        self._compiled = (self.template, self.renderer, compile_template(self.template, escape))

    def generate_submit_script(self, job: Job, context: Dict[str, object], out: IO[str]) -> None:
        out.write(self.render(context))

    def render(self, context: Dict[str, object]) -> str:
        """The script text for ``context``."""
        template, renderer, compiled = self._compiled
        if compiled is not None and type(context) is dict and template is self.template \
                and renderer is self.renderer:
            try:
                return compiled(context)
            except NeedsPystache:
                pass  # a lambda or bytes in the context: pystache renders it all
        text: str = self.renderer.render(self.template, context)
        return text


_STANDALONE_PARTIAL = re.compile(r"^([ \t]*)\{\{>\s*([^}\s]+)\s*\}\}[ \t]*(?:\r?\n|\Z)",
                                 re.MULTILINE)
_INLINE_PARTIAL = re.compile(r"\{\{>\s*([^}\s]+)\s*\}\}")
_NON_BLANK_LINE = re.compile(r"^(.+)$", re.MULTILINE)
_PARTIAL_DEPTH = 10


def inline_partials(text: str, search: Sequence[Path], depth: int = 0) -> str:
    """``text`` with each ``{{> name}}`` replaced by the partial ``name.mustache`` found first
    in ``search`` (its own partials in place too); a partial found nowhere is left out, as
    the renderer does with missing tags. Raises ValueError for partials nested too deep (a
    partial that includes itself)."""
    if depth > _PARTIAL_DEPTH:
        raise ValueError(f"template partials nest more than {_PARTIAL_DEPTH} deep (one of them "
                         "includes itself?)")

    def load(name: str) -> str:
        for folder in search:
            candidate = folder / f"{name}.mustache"
            if candidate.is_file():
                return inline_partials(candidate.read_text(encoding="utf-8"), search, depth + 1)
        return ""

    def standalone(match: "re.Match[str]") -> str:
        return _NON_BLANK_LINE.sub(lambda m: match.group(1) + m.group(1), load(match.group(2)))

    text = _STANDALONE_PARTIAL.sub(standalone, text)
    return _INLINE_PARTIAL.sub(lambda m: load(m.group(1)), text)


def _shipped_templates() -> Optional[Path]:
    try:
        return data_dir("templates")
    except FileNotFoundError:
        return None
