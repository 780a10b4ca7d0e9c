"""The supported Pythons are said the same way everywhere: ``requires-python`` in
pyproject.toml is the oldest of its ``Programming Language :: Python :: 3.X`` classifiers,
which run without a gap to the newest; ruff's target is the oldest; README.md and
docs/getting-started.rst name both; the psij-python compatibility wheel asks for the same; and
``make pythons`` (tests/setup/pythons.sh, which installs and checks the oldest and the newest)
reads the same two versions (it is run by ``make test``)."""

import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def _project(path: Path) -> Dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


def _version(text: str) -> Tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def _supported() -> Tuple[str, List[str]]:
    project = _project(ROOT / "pyproject.toml")["project"]
    match = re.fullmatch(r">=\s*(3\.\d+)", project["requires-python"])
    assert match, project["requires-python"]
    classified = sorted((c.rsplit(" :: ", 1)[1] for c in project["classifiers"]
                         if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)),
                        key=_version)
    return match.group(1), classified


def test_requires_python_is_the_oldest_classifier_and_none_is_skipped() -> None:
    oldest, classified = _supported()
    assert classified and classified[0] == oldest, classified
    minors = [_version(v)[1] for v in classified]
    assert minors == list(range(minors[0], minors[-1] + 1)), classified


def test_the_tools_and_the_compatibility_wheel_target_the_oldest() -> None:
    oldest, _ = _supported()
    assert _project(ROOT / "pyproject.toml")["tool"]["ruff"]["target-version"] \
        == "py" + oldest.replace(".", "")
    compat = _project(ROOT / "compat" / "psij-python" / "pyproject.toml")
    assert compat["project"]["requires-python"] == f">={oldest}"


def test_the_readme_and_the_docs_say_the_same() -> None:
    oldest, classified = _supported()
    newest = classified[-1]
    readme = (ROOT / "README.md").read_text()
    started = " ".join((ROOT / "docs" / "getting-started.rst").read_text().split())
    for text in (readme, started):
        assert f"Python {oldest} or newer" in text
        assert f"{oldest} to {newest} are tested" in text
        assert not re.search(r"Python 3\.\d+ or newer", text.replace(
            f"Python {oldest} or newer", "")), "another oldest Python is named"


def test_make_pythons_checks_the_oldest_and_the_newest() -> None:
    oldest, classified = _supported()
    shown = subprocess.run(["bash", str(ROOT / "tests" / "setup" / "pythons.sh"), "--versions"],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == [oldest, classified[-1]]
    makefile = (ROOT / "Makefile").read_text()
    test_rule = re.search(r"^test:(.*)$", makefile, re.M)
    assert test_rule and "pythons" in test_rule.group(1).split()

