"""The ``--help`` description of a benchmark script: the first paragraph of its docstring, whole
(its first line alone stops mid-sentence when the paragraph wraps)."""


def description(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n")[0].split())
