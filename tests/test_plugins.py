"""Plugin discovery rules, checked with third-party plugins installed next to psij.

Each check runs in a fresh interpreter whose ``PYTHONPATH`` holds the plugin folders, because
discovery reads ``sys.path`` once per process. Two versions of one executor package are built
and installed with pip into two separate folders, as a site would side-load a newer version.
"""

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Dict, List, Sequence

import pytest
from packaging.version import Version

from psij.descriptor import Descriptor

PYTHON = sys.executable
PSIJ_SCRIPT = Path(sys.executable).parent / "psij"

DEMO_EXECUTOR = textwrap.dedent('''
    """A stand-in third-party executor: it only says which build of it was loaded."""

    from psij import JobExecutor

    BUILT_VERSION = "{version}"


    class DemoJobExecutor(JobExecutor):
        built_version = BUILT_VERSION

        def submit(self, job):
            raise NotImplementedError

        def cancel(self, job):
            raise NotImplementedError

        def list(self):
            return []

        def attach(self, job, native_id):
            raise NotImplementedError
''')

DESCRIPTOR = textwrap.dedent('''
    from packaging.version import Version

    from psij.descriptor import Descriptor

    __PSI_J_EXECUTORS__ = [
        {descriptors}
    ]
''')


def _descriptor(name: str, version: str, cls: str, aliases: Sequence[str] = ()) -> str:
    alias_arg = f", aliases={list(aliases)!r}" if aliases else ""
    return f"Descriptor(name={name!r}, version=Version({version!r}), cls={cls!r}{alias_arg}),"


def write_plugin(root: Path, package: str, descriptor_file: str, descriptors: List[str],
                 module_body: str) -> None:
    """Lay out a plugin as it looks once installed: descriptor file plus package."""
    (root / "psij-descriptors").mkdir(parents=True, exist_ok=True)
    (root / "psij-descriptors" / descriptor_file).write_text(
        DESCRIPTOR.format(descriptors="\n    ".join(descriptors)))
    (root / package).mkdir(parents=True, exist_ok=True)
    (root / package / "__init__.py").write_text("")
    (root / package / "executor.py").write_text(module_body)


def build_and_install(project: Path, target: Path, version: str) -> None:
    """A real pip install of the demo executor package, built offline with hatchling."""
    write_plugin(project, "psij_demo_exec", "psij_demo_exec.py",
                 [_descriptor("demo", version, "psij_demo_exec.executor.DemoJobExecutor",
                              aliases=["demo-alias"])],
                 DEMO_EXECUTOR.format(version=version))
    (project / "pyproject.toml").write_text(textwrap.dedent(f'''
        [build-system]
        requires = ["hatchling"]
        build-backend = "hatchling.build"

        [project]
        name = "psij-demo-exec"
        version = "{version}"
        dependencies = ["psij"]

        [tool.hatch.build.targets.wheel]
        packages = ["psij_demo_exec", "psij-descriptors"]
    '''))
    subprocess.run(
        [PYTHON, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--no-build-isolation", "--no-index", "--target", str(target), str(project)],
        check=True, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """Version 1.0 installed in folder ``a``, version 2.0 in folder ``b``."""
    base = tmp_path_factory.mktemp("plugins")
    dirs = {"a": base / "site-a", "b": base / "site-b"}
    build_and_install(base / "proj-1.0", dirs["a"], "1.0")
    build_and_install(base / "proj-2.0", dirs["b"], "2.0")
    for d in dirs.values():
        assert (d / "psij-descriptors" / "psij_demo_exec.py").is_file()
        assert (d / "psij_demo_exec" / "executor.py").is_file()
    return {k: v.resolve() for k, v in dirs.items()}


def run_python(code: str, path: Sequence[Path]) -> Dict[str, Any]:
    """Run ``code`` with ``path`` first on sys.path; it prints one JSON object as its result."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in path))
    proc = subprocess.run([PYTHON, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result: Dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


SELECT = textwrap.dedent('''
    import json, sys
    import psij

    def pick(name, constraint=None):
        ex = psij.JobExecutor.get_instance(name, version_constraint=constraint)
        module = sys.modules[type(ex).__module__]
        return {"version": str(ex.version), "built": ex.built_version, "name": ex.name,
                "file": module.__file__}
''')


def with_pick(body: str) -> str:
    """A script that defines ``pick(name, constraint)`` (it reports the chosen plugin) first."""
    return SELECT + textwrap.dedent(body)


@pytest.mark.parametrize("order", ["ba", "ab"])
def test_highest_version_wins_without_constraint(installed: Dict[str, Path], order: str) -> None:
    path = [installed[k] for k in order]
    got = run_python(with_pick('print(json.dumps(pick("demo")))'), path)
    assert got["version"] == "2.0"
    assert got["built"] == "2.0"
    assert Path(got["file"]).is_relative_to(installed["b"])


def test_constraint_loads_the_class_from_its_own_folder(installed: Dict[str, Path]) -> None:
    # The 2.0 folder comes first on sys.path, so a plain import would find 2.0's module;
    # the 1.0 class must still come from the 1.0 folder, and both can be used side by side.
    got = run_python(with_pick('''
        old = pick("demo", "< 2")
        new = pick("demo")
        print(json.dumps({"old": old, "new": new}))
    '''), [installed["b"], installed["a"]])
    old, new = got["old"], got["new"]
    assert (old["version"], old["built"]) == ("1.0", "1.0")
    assert Path(old["file"]).is_relative_to(installed["a"])
    assert (new["version"], new["built"]) == ("2.0", "2.0")
    assert Path(new["file"]).is_relative_to(installed["b"])


def test_unsatisfiable_constraint_lists_versions(installed: Dict[str, Path]) -> None:
    got = run_python('''
        import json, psij
        try:
            psij.JobExecutor.get_instance("demo", version_constraint=">= 3")
            print(json.dumps({"error": None}))
        except ValueError as ex:
            print(json.dumps({"error": str(ex)}))
    ''', [installed["a"], installed["b"]])
    assert got["error"] is not None
    assert ">= 3" in got["error"]
    assert "1.0" in got["error"] and "2.0" in got["error"]


def test_alias_selects_the_same_plugin(installed: Dict[str, Path]) -> None:
    got = run_python(with_pick('''
        print(json.dumps({"alias": pick("DEMO-alias", "< 2"),
                          "names": sorted(psij.JobExecutor.get_executor_names())}))
    '''), [installed["b"], installed["a"]])
    assert (got["alias"]["version"], got["alias"]["built"]) == ("1.0", "1.0")
    assert got["alias"]["name"] == "DEMO-alias"
    assert {"demo", "demo-alias"} <= set(got["names"])


@pytest.fixture
def broken_and_hidden(tmp_path: Path) -> Path:
    """A folder with a plugin whose module raises on import and a plugin named ``_hidden``."""
    root = tmp_path / "site-c"
    write_plugin(root, "broken_pkg", "broken_pkg.py",
                 [_descriptor("broken", "1.0", "broken_pkg.executor.BrokenJobExecutor")],
                 'raise RuntimeError("broken plugin module refuses to import")\n')
    write_plugin(root, "hidden_pkg", "hidden_pkg.py",
                 [_descriptor("_hidden", "0.5", "hidden_pkg.executor.DemoJobExecutor")],
                 DEMO_EXECUTOR.format(version="0.5"))
    return root.resolve()


def test_broken_plugin_fails_only_when_asked_for(installed: Dict[str, Path],
                                                broken_and_hidden: Path) -> None:
    got = run_python(with_pick('''
        names = sorted(psij.JobExecutor.get_executor_names())
        demo = pick("demo")
        try:
            psij.JobExecutor.get_instance("broken")
            error = None
        except ValueError as ex:
            error = {"message": str(ex), "cause": repr(ex.__cause__)}
        print(json.dumps({"names": names, "demo": demo, "error": error}))
    '''), [broken_and_hidden, installed["a"]])
    assert "broken" in got["names"] and "demo" in got["names"]
    assert got["demo"]["built"] == "1.0"
    assert got["error"] is not None
    assert got["error"]["message"].startswith("Unable to load executor broken: version 1.0 ")
    assert "broken plugin module refuses to import" in got["error"]["message"]
    assert got["error"]["cause"].startswith("RuntimeError(")


def test_unknown_name_lists_visible_names_only(installed: Dict[str, Path],
                                               broken_and_hidden: Path) -> None:
    got = run_python(with_pick('''
        try:
            psij.JobExecutor.get_instance("nosuchexecutor")
            error = None
        except ValueError as ex:
            error = str(ex)
        print(json.dumps({"error": error, "names": sorted(psij.JobExecutor.get_executor_names()),
                          "hidden": pick("_hidden")}))
    '''), [broken_and_hidden, installed["a"]])
    assert got["error"] is not None
    assert "nosuchexecutor" in got["error"]
    assert "demo" in got["error"] and "broken" in got["error"]
    assert "_hidden" not in got["error"]
    assert "_hidden" not in got["names"]
    # Hidden from listings, still usable by name.
    assert got["hidden"]["built"] == "0.5"


def test_import_psij_loads_no_plugin(installed: Dict[str, Path],
                                     broken_and_hidden: Path) -> None:
    got = run_python('''
        import json, sys
        import psij
        import psij._plugins
        loaded = sorted(m for m in sys.modules
                        if m.startswith(("psij.executors", "psij.launchers", "psij_demo_exec",
                                         "broken_pkg", "hidden_pkg", "psij-descriptors",
                                         "_psij_plugin")))
        print(json.dumps({"loaded": loaded,
                          "discovered": psij._plugins.REGISTRY._entries is not None}))
    ''', [broken_and_hidden, installed["a"]])
    assert got == {"loaded": [], "discovered": False}


def test_plugins_command_lists_broken_descriptor_files(installed: Dict[str, Path],
                                                       broken_and_hidden: Path,
                                                       tmp_path: Path) -> None:
    bad = tmp_path / "site-d" / "psij-descriptors" / "explodes.py"
    bad.parent.mkdir(parents=True)
    bad.write_text('raise RuntimeError("descriptor file exploded")\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        str(p) for p in (tmp_path / "site-d", broken_and_hidden, installed["a"])))
    proc = subprocess.run([str(PSIJ_SCRIPT), "plugins"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    broken_section = out.split("Broken descriptor files:", 1)[1]
    assert str(bad.resolve()) in broken_section
    assert "RuntimeError: descriptor file exploded" in broken_section
    # The other plugins are still listed, each with its own load result.
    demo = _block(out, "demo 1.0")
    assert "status:     ok" in demo
    assert str(installed["a"] / "psij_demo_exec" / "executor.py") in demo
    assert "psij_demo_exec.executor.DemoJobExecutor" in demo
    assert "alias of demo" in _block(out, "demo-alias 1.0")
    assert "broken plugin module refuses to import" in _block(out, "broken 1.0")


def _block(out: str, title: str) -> str:
    """The lines of ``psij plugins`` output that describe the plugin titled ``title``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {title}"))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("    ")),
               len(lines))
    return "\n".join(lines[start:end])


def test_same_declaration_twice_for_one_file_is_not_a_clash(tmp_path: Path) -> None:
    root = tmp_path / "site-e"
    twin = _descriptor("twin", "1.0", "twin_pkg.executor.DemoJobExecutor")
    write_plugin(root, "twin_pkg", "first.py", [twin], DEMO_EXECUTOR.format(version="1.0"))
    (root / "psij-descriptors" / "second.py").write_text(
        DESCRIPTOR.format(descriptors=twin))
    got = run_python('''
        import json
        from psij._plugins import describe
        print(json.dumps([r for r in describe("executor") if r["name"] == "twin"]))
    ''', [root])
    assert len(got) == 1
    assert got[0]["notes"] == []
    assert got[0]["error"] is None


def test_same_declaration_for_two_files_is_reported_and_first_wins(tmp_path: Path) -> None:
    first, second = tmp_path / "site-f", tmp_path / "site-g"
    for root, built in ((first, "first"), (second, "second")):
        write_plugin(root, "clash_pkg", "clash_pkg.py",
                     [_descriptor("clash", "1.0", "clash_pkg.executor.DemoJobExecutor")],
                     DEMO_EXECUTOR.format(version=built))
    got = run_python(with_pick('''
        from psij._plugins import describe
        records = [r for r in describe("executor") if r["name"] == "clash"]
        print(json.dumps({"records": records, "picked": pick("clash")}))
    '''), [first, second])
    assert len(got["records"]) == 1
    notes = got["records"][0]["notes"]
    assert len(notes) == 1
    assert str(second.resolve() / "clash_pkg" / "executor.py") in notes[0]
    assert str(first.resolve() / "psij-descriptors" / "clash_pkg.py") in notes[0]
    assert got["picked"]["built"] == "first"

    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(first), str(second))))
    proc = subprocess.run([str(PSIJ_SCRIPT), "plugins"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "note:" in _block(proc.stdout, "clash 1.0")


@pytest.fixture
def failing_plugins(tmp_path: Path) -> Path:
    """Plugins that fail in the ways installed packages do: a package whose ``__init__.py``
    raises NameError, a module that calls ``sys.exit`` when a dependency is missing, a class
    that is not an executor, and a launcher in the NameError package."""
    root = tmp_path / "site-h"
    write_plugin(root, "nameerr_pkg", "nameerr_pkg.py",
                 [_descriptor("nameerr", "1.0", "nameerr_pkg.executor.DemoJobExecutor")],
                 DEMO_EXECUTOR.format(version="1.0"))
    (root / "nameerr_pkg" / "__init__.py").write_text("undefined_at_import\n")
    (root / "nameerr_pkg" / "launcher.py").write_text("class DemoLauncher:\n    pass\n")
    (root / "psij-descriptors" / "nameerr_launcher.py").write_text(textwrap.dedent('''
        from packaging.version import Version
        from psij.descriptor import Descriptor

        __PSI_J_LAUNCHERS__ = [Descriptor(name="nameerr-launcher", version=Version("0.3"),
                                          cls="nameerr_pkg.launcher.DemoLauncher")]
    '''))
    write_plugin(root, "exits_pkg", "exits_pkg.py",
                 [_descriptor("exits", "2.0", "exits_pkg.executor.DemoJobExecutor")],
                 "import sys\nsys.exit('exits_pkg needs a library that is not installed')\n")
    write_plugin(root, "notexec_pkg", "notexec_pkg.py",
                 [_descriptor("notexec", "1.0", "notexec_pkg.executor.NotAnExecutor")],
                 "class NotAnExecutor:\n    pass\n")
    return root.resolve()


def test_load_errors_are_kept_for_when_the_plugin_is_asked_for(failing_plugins: Path,
                                                              installed: Dict[str, Path]) -> None:
    got = run_python(with_pick('''
        names = sorted(psij.JobExecutor.get_executor_names())
        errors = {}
        for kind, name in [("executor", "nameerr"), ("executor", "exits"),
                           ("executor", "notexec"), ("launcher", "nameerr-launcher")]:
            get = psij.JobExecutor.get_instance if kind == "executor" else \\
                psij.Launcher.get_instance
            try:
                get(name)
                errors[name] = None
            except ValueError as ex:
                errors[name] = {"message": str(ex), "cause": type(ex.__cause__).__name__}
        print(json.dumps({"names": names, "errors": errors, "demo": pick("demo"),
                          "launchers": sorted(psij.Launcher.get_launcher_names())}))
    '''), [failing_plugins, installed["a"]])
    assert {"nameerr", "exits", "notexec", "demo"} <= set(got["names"])
    assert "nameerr-launcher" in got["launchers"]
    assert got["demo"]["built"] == "1.0"
    descriptors = failing_plugins / "psij-descriptors"
    errors = got["errors"]
    assert errors["nameerr"] == {
        "message": f"Unable to load executor nameerr: version 1.0 declared in "
                   f"{descriptors / 'nameerr_pkg.py'}: NameError: name 'undefined_at_import' is "
                   "not defined",
        "cause": "NameError"}
    assert errors["exits"]["message"].startswith("Unable to load executor exits: version 2.0 ")
    assert errors["exits"]["message"].endswith(
        "SystemExit: exits_pkg needs a library that is not installed")
    assert errors["exits"]["cause"] == "SystemExit"
    assert errors["notexec"] == {
        "message": f"Unable to load executor notexec: version 1.0 declared in "
                   f"{descriptors / 'notexec_pkg.py'}: notexec_pkg.executor.NotAnExecutor is "
                   "not a psij.JobExecutor",
        "cause": "NoneType"}
    assert errors["nameerr-launcher"]["message"].startswith(
        "Unable to load launcher nameerr-launcher: version 0.3 ")
    assert errors["nameerr-launcher"]["cause"] == "NameError"

    # `psij plugins` lists every one of them with its error and still succeeds.
    env = dict(os.environ, PYTHONPATH=str(failing_plugins))
    proc = subprocess.run([str(PSIJ_SCRIPT), "plugins"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "NameError: name 'undefined_at_import'" in _block(proc.stdout, "nameerr 1.0")
    assert "SystemExit: exits_pkg needs" in _block(proc.stdout, "exits 2.0")
    assert "NameError" in _block(proc.stdout, "nameerr-launcher 0.3")


class StrictVersionShaped:
    """What a distutils StrictVersion holds: a ``version`` tuple and a str() of it."""

    def __init__(self, text: str) -> None:
        self.version = tuple(int(p) for p in text.split("."))

    def __str__(self) -> str:
        return ".".join(str(p) for p in self.version)


class LooseVersionShaped:
    """What a distutils LooseVersion holds: the text as ``vstring`` and a ``version`` list."""

    def __init__(self, text: str) -> None:
        self.vstring = text
        self.version = [int(p) if p.isdigit() else p for p in text.split(".")]


@pytest.mark.parametrize("given, expected", [
    (Version("1.2"), "1.2"), ("0.0.1", "0.0.1"), (StrictVersionShaped("0.0.1"), "0.0.1"),
    (LooseVersionShaped("2.1.post3"), "2.1.post3"), (LooseVersionShaped("3.0rc1"), "3.0rc1"),
])
def test_descriptor_versions_are_normalized_to_packaging(given: object, expected: str) -> None:
    desc = Descriptor(name="x", version=given, cls="pkg.mod.Cls")
    assert type(desc.version) is Version and desc.version == Version(expected)


def test_descriptor_versions_from_real_distutils() -> None:
    with warnings.catch_warnings():
        # distutils, and setuptools' copy of it, warn on import and on making a version.
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            from distutils.version import LooseVersion, StrictVersion
        except ImportError:
            pytest.skip("no distutils in this Python (removed in 3.12); the shaped classes "
                        "stand in for it")
        strict, loose = StrictVersion("0.0.1"), LooseVersion("1.10.2")
        prerelease = StrictVersion("1.0b2")
    assert Descriptor("x", strict, "p.m.C").version == Version("0.0.1")
    assert Descriptor("x", loose, "p.m.C").version == Version("1.10.2")
    assert Descriptor("x", prerelease, "p.m.C").version == Version("1.0b2")


@pytest.mark.parametrize("given, exc", [
    (LooseVersionShaped("1.0-custom.x"), ValueError), (1.0, TypeError), (object(), TypeError),
    (None, TypeError),
])
def test_descriptor_versions_that_cannot_be_read_name_the_field(given: object,
                                                                exc: type) -> None:
    with pytest.raises(exc, match=r"Descriptor\.version: .*accepted: .*StrictVersion"):
        Descriptor("x", given, "p.m.C")


SHAPED_STRICT_VERSION = '''
class StrictVersion:
    def __init__(self, text):
        self.version = tuple(int(p) for p in text.split("."))

    def __str__(self):
        return ".".join(map(str, self.version))
'''


def published_plugin_descriptor(name: str, cls: str, version_class: str) -> str:
    """A descriptor file in the shape psij-zmq and psij-rest 0.5.0 publish."""
    source = ("from distutils.version import StrictVersion\n" if version_class == "distutils"
              else SHAPED_STRICT_VERSION)
    return (f"{source}\nfrom psij.descriptor import Descriptor\n\n__PSI_J_EXECUTORS__ = "
            f"[Descriptor(name={name!r}, version=StrictVersion('0.0.1'), cls={cls!r})]\n")


@pytest.mark.parametrize("version_class", ["shaped", "distutils"])
def test_published_plugins_declaring_strict_versions_are_listed(tmp_path: Path,
                                                                version_class: str) -> None:
    if version_class == "distutils":
        probe = subprocess.run([PYTHON, "-W", "ignore", "-c", "import distutils.version"],
                               capture_output=True, timeout=60)
        if probe.returncode != 0:
            pytest.skip("no distutils in this Python (removed in 3.12)")
    root = tmp_path / "site-z"
    (root / "psij-descriptors").mkdir(parents=True)
    (root / "psij-descriptors" / "zmq_service_descriptor.py").write_text(
        published_plugin_descriptor(
            "zmq", "psij-zmq.executors.zmq_service.ZMQServiceJobExecutor", version_class))
    (root / "psij-descriptors" / "rest_service_descriptor.py").write_text(
        published_plugin_descriptor(
            "rest", "psij.executors.rest_service.RestServiceJobExecutor", version_class))
    (root / "psij-zmq" / "executors").mkdir(parents=True)
    (root / "psij-zmq" / "__init__.py").write_text("")
    (root / "psij-zmq" / "executors" / "__init__.py").write_text("")
    (root / "psij-zmq" / "executors" / "zmq_service.py").write_text(
        "import zmq_not_installed_here\n")
    # Warnings are errors, as in a test suite run with -W error: the distutils import of the
    # descriptor files must not hide the plugins.
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONWARNINGS="error")
    code = textwrap.dedent('''
        import json, psij
        from psij._plugins import describe
        names = sorted(psij.JobExecutor.get_executor_names())
        try:
            psij.JobExecutor.get_instance("zmq")
            error = None
        except ValueError as ex:
            error = str(ex)
        versions = {r["name"]: r["version"] for r in describe("executor")}
        print(json.dumps({"names": names, "error": error, "versions": versions}))
    ''')
    proc = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert {"zmq", "rest", "local", "slurm"} <= set(got["names"])
    assert got["versions"]["zmq"] == got["versions"]["rest"] == "0.0.1"
    assert got["error"].startswith("Unable to load executor zmq: version 0.0.1 ")
    assert "zmq_not_installed_here" in got["error"]
    plugins = subprocess.run([str(PSIJ_SCRIPT), "plugins"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert plugins.returncode == 0, plugins.stderr
    assert "Broken descriptor files:\n  (none)" in plugins.stdout
    assert "module psij.executors.rest_service is not in" in _block(plugins.stdout, "rest 0.0.1")
    assert "ModuleNotFoundError" in _block(plugins.stdout, "zmq 0.0.1")
