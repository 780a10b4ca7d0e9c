"""A pytest plugin for psij-python's tests: the ``--executors`` option (a comma-separated list of
``executor[:launcher[:url]]``) parametrizes every test that takes ``execparams``; the report
header says which ``psij`` the tests import."""

from typing import List

import pytest
from executor_test_params import ExecutorTestParams


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--executors", action="store", default="local:single",
                     help="comma-separated executor[:launcher[:url]] entries to run the tests "
                          "that take 'execparams' with (default: local:single)")


def _executors(config: pytest.Config) -> List[ExecutorTestParams]:
    entries = [e.strip() for e in str(config.getoption("executors")).split(",")]
    if not all(entries):
        raise pytest.UsageError(f"--executors: empty entry in "
                                f"{config.getoption('executors')!r}")
    return [ExecutorTestParams(e) for e in entries]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "execparams" in metafunc.fixturenames:
        params = _executors(metafunc.config)
        metafunc.parametrize("execparams", params, ids=[str(p) for p in params])


def pytest_report_header(config: pytest.Config) -> str:
    import psij

    return f"psij under test: {psij.__version__} from {psij.__file__}"
