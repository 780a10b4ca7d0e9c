"""Sphinx configuration for the psij documentation (built offline: no intersphinx)."""

import os
import sys

# Build from the source tree even when psij is not installed in the interpreter running Sphinx.
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src")))

from psij.version import __version__

project = "psij"
author = "The psij authors"
copyright = "the psij authors"
version = __version__
release = __version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list = []

# Signatures stay short; parameter types are listed with each parameter's description.
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True}

# Every cross-reference must resolve (a broken one fails the build under -W). The build is
# offline, without intersphinx, so the few standard-library and ``packaging`` classes that
# appear in signatures are listed here and stay plain text.
nitpicky = True
nitpick_ignore = [
    ("py:class", "pathlib.Path"),
    ("py:class", "os.PathLike"),
    ("py:class", "datetime.timedelta"),
    ("py:class", "packaging.version.Version"),
    ("py:class", "Version"),
    ("py:class", "ValueError"),
    ("py:class", "PermissionError"),
    ("py:class", "psij._record.Record"),
    ("py:class", "threading.Event"),
    ("py:class", "threading.Condition"),
    ("py:class", "psij._clock.T"),
    ("py:class", "psij.executors.batch._submit_io.SubmitInputs"),  # private, in signatures
]
