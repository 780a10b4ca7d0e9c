"""psij/_gpu_ids.py: a ``gpus`` setting read without any probe (a count stays a count, ids are
normalized), the values of a GPU set, and the local executor's ``resource_pool`` check that
reads its ``gpus`` entry through it without loading the executors' GPU finding."""

import subprocess
import sys
from typing import Any, Tuple, Union

import pytest

from psij._gpu_ids import AMD, MAX_GPUS, NVIDIA, GpuSet, gpu_setting


@pytest.mark.parametrize("value, read", [
    (2, 2),
    (" 3 ", 3),
    (0, 0),
    (MAX_GPUS, MAX_GPUS),
    ("0,2,3", ("0", "2", "3")),
    (" 007 , MIG-ab/1", ("7", "MIG-ab/1")),
    ([0, "GPU-ff"], ("0", "GPU-ff")),
    ([], ()),
])
def test_a_setting_is_a_count_or_normalized_ids(value: Any,
                                                read: Union[int, Tuple[str, ...]]) -> None:
    assert gpu_setting("gpus", value) == read


@pytest.mark.parametrize("value, error, words", [
    (-1, ValueError, "got -1"),
    (float("inf"), TypeError, "got float inf"),
    ("1,1", ValueError, "GPU 1 is listed twice"),
    ("\udcff", ValueError, "is not a GPU id"),
    ("0\n1", ValueError, "is not a GPU id"),
])
def test_a_bad_setting_is_refused_naming_the_field(value: Any, error: type,
                                                   words: str) -> None:
    with pytest.raises(error) as info:
        gpu_setting("resource_pool['gpus']", value)
    assert str(info.value).startswith("resource_pool['gpus']: ") and words in str(info.value)


def test_a_set_hands_out_its_ids_in_the_vendor_s_variables() -> None:
    assert GpuSet(("1", "3")).environment(["3"]) == {"CUDA_VISIBLE_DEVICES": "3"}
    amd = GpuSet(["4", "6"], AMD, "rocm-smi")
    assert amd.ids == ("4", "6") and amd.vendor == AMD
    assert amd.environment(["4", "6"]) == {"ROCR_VISIBLE_DEVICES": "4,6",
                                          "HIP_VISIBLE_DEVICES": "0,1"}
    assert GpuSet(()).environment([]) == {} and GpuSet(()).vendor == NVIDIA
    with pytest.raises(ValueError, match="GpuSet.vendor: 'intel'"):
        GpuSet((), "intel")


def test_the_resource_pool_check_reads_gpus_without_the_executors_gpu_finding() -> None:
    code = ("import sys\n"
            "from psij import _check\n"
            "print(_check.resource_pool({'gpus': '2'}), _check.resource_pool({'gpus': 3}),"
            " _check.resource_pool({'gpus': '0,2'}))\n"
            "print('psij.executors._gpu_detect' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["{'gpus': ['0', '1']} {'gpus': 3} {'gpus': ['0', '2']}", "False"]
