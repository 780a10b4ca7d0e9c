"""Build hook of the psij-python compatibility wheel: version and dependency from psij's version.

The version is ``0.9.11+psij.<psij version>``: psij provides the API of psij-python 0.9.11, so
the wheel satisfies what clients ask of psij-python up to that release (``psij-python``,
``>= 0.9``, ``== 0.9.11``, ``~= 0.9.5``), and the local label says which psij it stands for.
It does not claim a later psij-python release it does not implement.
"""

import re
from pathlib import Path
from typing import Any, Dict

from hatchling.metadata.plugin.interface import MetadataHookInterface

# The psij-python release whose API psij provides.
PSIJ_PYTHON_API = "0.9.11"


class PsijVersionHook(MetadataHookInterface):
    """Fills in ``version`` and ``dependencies`` from ``src/psij/version.py``."""

    def update(self, metadata: Dict[str, Any]) -> None:
        version_file = Path(self.root).resolve().parents[1] / "src" / "psij" / "version.py"
        try:
            text = version_file.read_text(encoding="utf-8")
        except OSError as ex:
            raise RuntimeError(
                f"psij-python compatibility wheel: cannot read psij's version from "
                f"{version_file} ({ex}); build it from a psij source tree with "
                "`make compat-dist`") from None
        found = re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.MULTILINE)
        if found is None:
            raise RuntimeError(f"psij-python compatibility wheel: no __version__ in "
                               f"{version_file}")
        psij_version = found.group(1)
        # A local version label is letters and digits separated by dots.
        label = ".".join(p for p in re.split(r"[^A-Za-z0-9]+", psij_version.lower()) if p)
        metadata["version"] = f"{PSIJ_PYTHON_API}+psij.{label}"
        metadata["dependencies"] = [f"psij>={psij_version}"]
