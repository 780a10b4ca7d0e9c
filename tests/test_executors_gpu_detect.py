"""GPU detection (``psij.executors._gpu_detect``): the order of the sources, what each one
says, fake ``nvidia-smi`` and ``rocm-smi`` commands with hostile outputs, the
``/proc/driver/nvidia/gpus`` entries, and the overrides of ``--gpus`` and the ``gpus``
settings."""

import math
import os
import stat
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import pytest

from psij.executors import _gpu_detect
from psij.executors._gpu_detect import (
    AMD,
    MAX_GPUS,
    NVIDIA,
    GpuSet,
    detect_gpus,
    found_gpus,
    gpus_from_setting,
    parse_nvidia_smi,
    parse_rocm_smi,
    run_probe,
)

H100 = "NVIDIA H100 80GB HBM3"


def tool(folder: Path, name: str, body: str) -> Path:
    """An executable ``name`` in ``folder`` running the shell text ``body``."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(stat.S_IRWXU)
    return path


def nvidia_lines(count: int) -> str:
    return "".join(f"GPU {i}: {H100} (UUID: GPU-{i:08x}-0000)\n" for i in range(count))


def printing(text: str) -> str:
    """Shell text that prints ``text`` exactly (bytes kept)."""
    return "printf '%s' " + "'" + text.replace("'", "'\\''") + "'"


def search_path(tmp_path: Path) -> str:
    """A PATH of the fake tools of ``tmp_path/bin`` and the one program they use: nothing of
    the real machine (which may have nvidia-smi) is found on it."""
    system = tmp_path / "system"
    system.mkdir(exist_ok=True)
    sleep = next(p for p in ("/bin/sleep", "/usr/bin/sleep") if os.path.exists(p))
    if not (system / "sleep").exists():
        (system / "sleep").symlink_to(sleep)
    return f"{tmp_path / 'bin'}:{system}"


def machine(tmp_path: Path, proc: Optional[Path] = None, **environ: str
            ) -> Tuple[Dict[str, str], str]:
    """An environment whose PATH holds only the fake tools, and the /proc path to read."""
    env = {"PATH": search_path(tmp_path)}
    env.update(environ)
    return env, str(proc if proc is not None else tmp_path / "no-proc")


def detect(tmp_path: Path, proc: Optional[Path] = None, timeout: float = 10.0,
           **environ: str) -> GpuSet:
    env, proc_path = machine(tmp_path, proc, **environ)
    return detect_gpus(env, proc_path, timeout)


# -- the order of the sources ------------------------------------------------------------------


@pytest.mark.parametrize("environ, ids, vendor, source", [
    ({"CUDA_VISIBLE_DEVICES": "2,3"}, ("2", "3"), NVIDIA, "CUDA_VISIBLE_DEVICES"),
    ({"CUDA_VISIBLE_DEVICES": ""}, (), NVIDIA, "CUDA_VISIBLE_DEVICES"),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, (), NVIDIA, "CUDA_VISIBLE_DEVICES"),
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, (), NVIDIA, "CUDA_VISIBLE_DEVICES"),
    ({"CUDA_VISIBLE_DEVICES": "1,-1,2"}, ("1",), NVIDIA, "CUDA_VISIBLE_DEVICES"),
    ({"CUDA_VISIBLE_DEVICES": "GPU-4b2c1a9f-8d3e,MIG-7/1/0"}, ("GPU-4b2c1a9f-8d3e", "MIG-7/1/0"),
     NVIDIA, "CUDA_VISIBLE_DEVICES"),
    ({"CUDA_VISIBLE_DEVICES": "0,0,1"}, ("0", "1"), NVIDIA, "CUDA_VISIBLE_DEVICES"),
    ({"CUDA_VISIBLE_DEVICES": "0,banana,1"}, ("0",), NVIDIA, "CUDA_VISIBLE_DEVICES"),
    ({"CUDA_VISIBLE_DEVICES": "\udcff,1"}, (), NVIDIA, "CUDA_VISIBLE_DEVICES"),
    ({"ROCR_VISIBLE_DEVICES": "4, 6"}, ("4", "6"), AMD, "ROCR_VISIBLE_DEVICES"),
    # HIP indices pick from what ROCR exposes, as the ROCm runtime reads them.
    ({"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "1,3"}, ("5", "7"), AMD,
     "ROCR_VISIBLE_DEVICES"),
    ({"ROCR_VISIBLE_DEVICES": "4,5", "HIP_VISIBLE_DEVICES": "1,9"}, ("5",), AMD,
     "ROCR_VISIBLE_DEVICES"),
    ({"HIP_VISIBLE_DEVICES": "1"}, ("1",), AMD, "HIP_VISIBLE_DEVICES"),
    # The first one set wins, even empty.
    ({"CUDA_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": "0"}, (), NVIDIA,
     "CUDA_VISIBLE_DEVICES"),
])
def test_visible_devices_variables_restrict_and_say_the_vendor(
        tmp_path: Path, environ: Dict[str, str], ids: Tuple[str, ...], vendor: str,
        source: str) -> None:
    tool(tmp_path / "bin", "nvidia-smi", printing(nvidia_lines(8)))  # never asked
    found = detect(tmp_path, **environ)
    assert (found.ids, found.vendor, found.source) == (ids, vendor, source)


@pytest.mark.parametrize("environ, ids, source", [
    ({"SLURM_STEP_GPUS": "1,3", "SLURM_JOB_GPUS": "0,1,2,3", "SLURM_GPUS_ON_NODE": "4"},
     ("1", "3"), "SLURM_STEP_GPUS"),
    ({"SLURM_JOB_GPUS": "0,2", "SLURM_GPUS_ON_NODE": "2"}, ("0", "2"), "SLURM_JOB_GPUS"),
    ({"SLURM_GPUS_ON_NODE": "3"}, ("0", "1", "2"), "SLURM_GPUS_ON_NODE"),
    ({"SLURM_STEP_GPUS": "", "SLURM_JOB_GPUS": "oops", "SLURM_GPUS_ON_NODE": "2"},
     ("0", "1"), "SLURM_GPUS_ON_NODE"),
    # Unreadable counts are passed over: the tools speak next.
    ({"SLURM_GPUS_ON_NODE": "99999"}, ("0",), "nvidia-smi -L"),
    ({"SLURM_GPUS_ON_NODE": "-2"}, ("0",), "nvidia-smi -L"),
])
def test_inside_a_slurm_job_its_gpu_variables_come_next(
        tmp_path: Path, environ: Dict[str, str], ids: Tuple[str, ...], source: str) -> None:
    tool(tmp_path / "bin", "nvidia-smi", printing(nvidia_lines(1)))
    found = detect(tmp_path, SLURM_JOB_ID="42", **environ)
    assert (found.ids, found.source) == (ids, source)
    assert found.vendor == NVIDIA  # this machine has nvidia-smi


def test_slurm_gpu_variables_outside_a_slurm_job_are_not_read(tmp_path: Path) -> None:
    assert detect(tmp_path, SLURM_GPUS_ON_NODE="2").ids == ()


def test_slurm_gpus_on_an_amd_machine_are_handed_out_in_the_rocm_variables(
        tmp_path: Path) -> None:
    tool(tmp_path / "bin", "rocm-smi", "exit 3")
    found = detect(tmp_path, SLURM_JOB_ID="42", SLURM_JOB_GPUS="2,3")
    assert found.vendor == AMD
    assert found.environment(("3",)) == {"ROCR_VISIBLE_DEVICES": "3",
                                         "HIP_VISIBLE_DEVICES": "0"}


def test_nvidia_smi_then_rocm_smi_then_proc(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for bus in ("0000:3b:00.0", "0000:86:00.0", "0000:af:00.0"):
        (proc / bus).mkdir(parents=True)
    assert detect(tmp_path, proc) == GpuSet(("0", "1", "2"), NVIDIA, str(proc))
    tool(tmp_path / "bin", "rocm-smi", printing(
        "device,Device Name,Device ID,Device Rev,Subsystem ID,GUID\n"
        "card0,AMD Instinct MI250X,0x740c,0x01,0x0b0c,1234\n"
        "card1,AMD Instinct MI250X,0x740c,0x01,0x0b0c,5678\n"))
    assert detect(tmp_path, proc) == GpuSet(("0", "1"), AMD, "rocm-smi --showid --csv")
    tool(tmp_path / "bin", "nvidia-smi", printing(nvidia_lines(2)))
    assert detect(tmp_path, proc) == GpuSet(("0", "1"), NVIDIA, "nvidia-smi -L")


def test_a_tool_that_lists_no_gpu_lets_the_next_source_speak(tmp_path: Path) -> None:
    tool(tmp_path / "bin", "nvidia-smi", "echo 'No devices were found'")
    tool(tmp_path / "bin", "rocm-smi", printing("device,Device ID\ncard3,0x740c\n"))
    assert detect(tmp_path) == GpuSet(("3",), AMD, "rocm-smi --showid --csv")


def test_nothing_found_is_no_gpu(tmp_path: Path) -> None:
    found = detect(tmp_path)
    assert found.ids == () and found.environment(()) == {}
    assert found.describe() == "no GPU (from none found)"


def test_the_tools_get_a_closed_stdin_and_their_own_arguments(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    tool(tmp_path / "bin", "nvidia-smi",
         f'echo "$*" > {seen}; if read line; then echo read >> {seen}; fi; '
         f"{printing(nvidia_lines(1))}")
    assert detect(tmp_path).ids == ("0",)
    assert seen.read_text() == "-L\n"  # and nothing could be read from stdin


# -- hostile outputs -----------------------------------------------------------------------------


@pytest.mark.parametrize("body, ids", [
    (printing("garbage\n\x00\x01\nGPU x: nope\nGPU 1 missing colon\n"), ()),
    (printing(f"  MIG 1g.10gb Device 0: (UUID: MIG-1)\nGPU 3: {H100}\n"), ("3",)),
    ("printf 'GPU 0: \\377\\376 name\\nGPU 1: \\200\\n'", ("0", "1")),  # not UTF-8
    (printing(f"GPU 0: {H100}\nGPU 0: {H100}\n"), ("0",)),  # listed twice
    (printing("GPU \u0663: arabic-indic digit\nGPU 99999999999: too long\n"), ()),
    (printing(nvidia_lines(1)) + "; exit 9", ()),  # a failing tool is not believed
    ("kill -9 $$", ()),
    ("exec 1>&-; exit 0", ()),
])
def test_hostile_nvidia_smi_outputs_give_what_can_be_read(tmp_path: Path, body: str,
                                                          ids: Tuple[str, ...]) -> None:
    tool(tmp_path / "bin", "nvidia-smi", body)
    assert detect(tmp_path).ids == ids


def test_a_thousand_gpus_are_all_read(tmp_path: Path) -> None:
    tool(tmp_path / "bin", "nvidia-smi", printing(nvidia_lines(1000)))
    found = detect(tmp_path)
    assert found.ids == tuple(str(i) for i in range(1000))
    assert found.describe().startswith("1000 GPUs (nvidia: 0, 1, 2, 3, 4, 5, 6, 7, ...) from")


def test_more_than_the_most_gpus_are_cut_at_the_most(tmp_path: Path) -> None:
    text = nvidia_lines(MAX_GPUS + 10)
    assert parse_nvidia_smi(text) == tuple(str(i) for i in range(MAX_GPUS))
    many = ",".join(str(i) for i in range(MAX_GPUS + 10))
    assert len(detect(tmp_path, CUDA_VISIBLE_DEVICES=many).ids) == MAX_GPUS


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie waiting for its parent counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def test_a_hanging_tool_is_killed_with_what_it_started(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    tool(tmp_path / "bin", "nvidia-smi",
         f"{printing(nvidia_lines(2))}; sleep 300 & echo $! > {child}; wait")
    tool(tmp_path / "bin", "rocm-smi", printing("card5,x\n"))
    assert detect(tmp_path, timeout=0.5) == GpuSet(("5",), AMD, "rocm-smi --showid --csv")
    pid = int(child.read_text())
    deadline = time.monotonic() + 10  # the kill has been sent: only its delivery is awaited
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gone(pid)


def test_an_endless_output_is_cut_at_the_limit(tmp_path: Path) -> None:
    yes = tool(tmp_path / "bin", "endless", f"while :; do {printing(nvidia_lines(4))}; done")
    text = run_probe([str(yes)], timeout=30, limit=10_000)
    assert text is not None and len(text.encode()) == 10_000
    assert parse_nvidia_smi(text) == ("0", "1", "2", "3")


def test_a_probe_that_cannot_start_is_none(tmp_path: Path) -> None:
    assert run_probe([str(tmp_path / "missing")]) is None
    (tmp_path / "plain").write_text("not executable")
    assert run_probe([str(tmp_path / "plain")]) is None


def test_rocm_smi_csv_lines_and_garbage() -> None:
    assert parse_rocm_smi("device,Device ID\ncard0,0x1\ncard2,0x1\nWARNING: x\ncardX,1\n"
                          "card2,again\n") == ("0", "2")
    assert parse_rocm_smi("") == ()


def test_a_bug_in_detection_gives_no_gpu_and_is_logged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_: Any) -> GpuSet:
        raise RuntimeError("bug")

    monkeypatch.setattr(_gpu_detect, "_detect", broken)
    assert detect(tmp_path).ids == ()
    assert "GPU detection failed" in caplog.text


def test_found_gpus_is_found_once_until_its_variables_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    count = tmp_path / "count"
    tool(tmp_path / "bin", "nvidia-smi", f"echo x >> {count}; {printing(nvidia_lines(2))}")
    for name in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                 "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", search_path(tmp_path))
    monkeypatch.setattr(_gpu_detect, "PROC_GPUS", str(tmp_path / "no-proc"))
    assert found_gpus().ids == ("0", "1")
    assert found_gpus().ids == ("0", "1")
    assert count.read_text() == "x\n"  # asked once
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert found_gpus() == GpuSet(("1",), NVIDIA, "CUDA_VISIBLE_DEVICES")


# -- the environment a task gets -----------------------------------------------------------------


def test_nvidia_tasks_get_cuda_and_amd_tasks_get_rocr_and_hip() -> None:
    assert GpuSet(("0", "3"), NVIDIA).environment(("3",)) == {"CUDA_VISIBLE_DEVICES": "3"}
    assert GpuSet(("4", "5", "6"), AMD).environment(("5", "6")) == {
        "ROCR_VISIBLE_DEVICES": "5,6", "HIP_VISIBLE_DEVICES": "0,1"}
    assert GpuSet(("0",), AMD).environment(()) == {}


# -- overrides -----------------------------------------------------------------------------------


THREE = GpuSet(("3", "5", "GPU-ab12"), AMD, "ROCR_VISIBLE_DEVICES")


@pytest.mark.parametrize("value, ids", [
    (2, ("3", "5")),  # the first found
    ("2", ("3", "5")),
    (4, ("0", "1", "2", "3")),  # more than found: counted from 0
    (0, ()),
    ("0,2,3", ("0", "2", "3")),
    (" 007 , GPU-ff", ("7", "GPU-ff")),
    (["1", "GPU-ab12"], ("1", "GPU-ab12")),
    ([0, 2], ("0", "2")),  # indices as numbers, as a TOML list gives them
    ([], ()),
])
def test_an_override_is_a_count_or_ids(value: Any, ids: Tuple[str, ...]) -> None:
    given = gpus_from_setting("--gpus", value, THREE)
    assert given == GpuSet(ids, AMD, "--gpus")


@pytest.mark.parametrize("value, error, words", [
    (-1, ValueError, "got -1"),
    (MAX_GPUS + 1, ValueError, f"got {MAX_GPUS + 1}"),
    (10 ** 30, ValueError, "a count from 0 to 4096"),
    (math.nan, TypeError, "got float nan"),
    (2.0, TypeError, "got float"),
    (True, TypeError, "got bool"),
    (None, TypeError, "got NoneType"),
    ("-1", ValueError, "'-1' is not a GPU id"),
    ("", ValueError, "'' is not a GPU id"),
    ("0,,1", ValueError, "'' is not a GPU id"),
    ("0,2,0", ValueError, "GPU 0 is listed twice"),
    ("0,00", ValueError, "GPU 0 is listed twice"),
    ("\ud800", ValueError, "is not a GPU id"),
    ("1e3", ValueError, "'1e3' is not a GPU id"),
    ("0;rm -rf /", ValueError, "is not a GPU id"),
    ([1.0, 2], TypeError, "id 1.0 is not a str or an index"),
    ([True], TypeError, "id True is not a str or an index"),
    ([-1], ValueError, "'-1' is not a GPU id"),
    (["0"] * (MAX_GPUS + 1), ValueError, "4097 ids"),
    ({"0": 1}, TypeError, "got dict"),
])
def test_hostile_overrides_are_refused_naming_the_option(value: Any, error: type,
                                                         words: str) -> None:
    with pytest.raises(error) as info:
        gpus_from_setting("--gpus", value, THREE)
    text = str(info.value)
    assert text.startswith("--gpus: ") and words in text
    assert "a count from 0 to 4096 or a list of distinct GPU ids" in text
