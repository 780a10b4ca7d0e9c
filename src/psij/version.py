"""The package version, kept in one place (read by the build and by ``psij.__version__``)."""

__version__ = "0.1.0"
VERSION = __version__
