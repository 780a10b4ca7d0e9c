"""psij-python's test launcher (``batch-test`` from its plugin folders) runs here as it runs on
psij-python (issue 21, item 16): its script runs a helper deployed next to it, which must keep
its executable bit. The plugin folder is ``tests/plugins/reference_batch_test``."""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from psij.launchers.script_based_launcher import deploy_files

PLUGIN = Path(__file__).parent.parent / "plugins" / "reference_batch_test"
HELPER = PLUGIN / "_psij_reference_batch_test" / "files" / "hostname"

RUN = textwrap.dedent('''
    import json, sys
    from datetime import timedelta
    from pathlib import Path
    import psij

    name, work, out = sys.argv[1:]
    config = psij.JobExecutorConfig(work_directory=Path(work))
    ex = psij.JobExecutor.get_instance(name, config=config)
    job = psij.Job(psij.JobSpec("/bin/hostname", launcher="batch-test", stdout_path=out,
                                resources=psij.ResourceSpecV1(process_count=2)))
    ex.submit(job)
    st = job.wait(timedelta(seconds=60))
    print(json.dumps({"state": str(st.state), "exit_code": st.exit_code,
                      "message": st.message, "launcher": str(psij.Launcher.get_instance(
                          "batch-test", config=config).version)}))
    ex.close()
''')


def test_the_helper_is_executable_in_the_source_tree() -> None:
    assert os.access(HELPER, os.X_OK), "git must keep the helper's mode (100755)"


@pytest.mark.parametrize("executor", ["batch-test", "local"])
def test_reference_test_launcher_runs_its_deployed_helper(executor: str, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(PLUGIN))
    out = tmp_path / "out.txt"
    proc = subprocess.run([sys.executable, "-c", RUN, executor, str(tmp_path / "work"), str(out)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["launcher"] == "0.0.1"
    assert (result["state"], result["exit_code"]) == ("COMPLETED", 0), result
    assert out.read_text().splitlines() == [f"{socket.gethostname()}-1"] * 2


def test_deployed_files_keep_their_executable_bit(tmp_path: Path) -> None:
    plain = tmp_path / "src" / "lib.sh"
    plain.parent.mkdir()
    plain.write_text("x=1\n")
    folder = deploy_files(tmp_path / "work", [plain, HELPER])
    assert (folder / "hostname").stat().st_mode & 0o777 == 0o700
    assert (folder / "lib.sh").stat().st_mode & 0o777 == 0o600
    # The same content without the bit is another deployment, never the executable one.
    copy = tmp_path / "src" / "hostname"
    copy.write_bytes(HELPER.read_bytes())
    other = deploy_files(tmp_path / "work", [plain, copy])
    assert other != folder and (other / "hostname").stat().st_mode & 0o777 == 0o600
    # A deployed folder whose helper lost its bit is replaced, not reused.
    os.chmod(folder / "hostname", 0o600)
    from psij.launchers import script_based_launcher

    script_based_launcher._deployed.clear()
    again = deploy_files(tmp_path / "work", [plain, HELPER])
    assert again == folder and (again / "hostname").stat().st_mode & 0o777 == 0o700
    assert subprocess.run([str(again / "hostname")], capture_output=True).returncode == 0
