"""GPU ids and sets of GPUs as values: what a node's GPUs are called, and the reading of a
``gpus`` setting (a count or a list of ids), shared by the checks of the model
(``psij._check``: the local executor's ``resource_pool``) and the GPU finding of the executors
(:mod:`psij.executors._gpu_detect`).

Plain values and checks only: this module runs no probe, reads no environment variable and
imports no executor.
"""

import re
from typing import Any, Dict, List, Sequence, Tuple, Union

from psij._record import Record

__all__ = ["AMD", "ID_PATTERN", "MAX_GPUS", "NVIDIA", "GpuSet", "gpu_setting"]

NVIDIA = "nvidia"
AMD = "amd"
MAX_GPUS = 4096
# An index, or a UUID as the drivers print them (GPU-..., MIG-...).
ID_PATTERN = r"^(?:[0-9]{1,9}|(?:GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]{0,127})$"


class GpuSet(Record):
    """The GPUs of a node: their ids (in order), their vendor, and where they were found."""

    ids: Tuple[str, ...]
    vendor: str = NVIDIA
    source: str = "none"

    def _validate(self) -> None:
        if self.vendor not in (NVIDIA, AMD):
            raise ValueError(f"GpuSet.vendor: {self.vendor!r}; accepted: {NVIDIA}, {AMD}")
        if type(self.ids) is not tuple:
            self._set("ids", tuple(self.ids))

    @property
    def variables(self) -> Tuple[str, ...]:
        """The variables that give a task its GPUs on this vendor's hardware."""
        if self.vendor == AMD:
            return ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
        return ("CUDA_VISIBLE_DEVICES",)

    def environment(self, ids: Sequence[str]) -> Dict[str, str]:
        """What a task given the GPUs ``ids`` (some of :attr:`ids`) gets in its environment;
        empty for none."""
        if not ids:
            return {}
        if self.vendor == AMD:
            return {"ROCR_VISIBLE_DEVICES": ",".join(ids),
                    "HIP_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(ids)))}
        return {"CUDA_VISIBLE_DEVICES": ",".join(ids)}

    def describe(self) -> str:
        """The GPUs in words, with their source: ``2 GPUs (nvidia: 0, 1) from nvidia-smi``."""
        if not self.ids:
            return f"no GPU (from {self.source})"
        shown = ", ".join(self.ids[:8]) + (", ..." if len(self.ids) > 8 else "")
        word = "GPU" if len(self.ids) == 1 else "GPUs"
        return f"{len(self.ids)} {word} ({self.vendor}: {shown}) from {self.source}"


def gpu_setting(field: str, value: Any) -> Union[int, Tuple[str, ...]]:
    """A ``gpus`` setting read: a count (int, or text of digits) from 0 to :data:`MAX_GPUS`,
    or the distinct ids of a list (``"0,2,3"``, or a list of str or of int indices; indices
    written without leading zeros). Raises ``ValueError``/``TypeError`` naming ``field``."""
    accepted = (f"a count from 0 to {MAX_GPUS} or a list of distinct GPU ids (indices or "
                f"GPU-/MIG- UUIDs), e.g. 2 or 0,2,3")
    if isinstance(value, bool) or not isinstance(value, (int, str, list, tuple)):
        raise TypeError(f"{field}: expected {accepted}, got {type(value).__name__} "
                        f"{value!r:.80}")
    if isinstance(value, str):
        text = value.strip()
        if text.isascii() and text.isdigit():
            value = int(text)
        else:
            value = text.split(",")
    if isinstance(value, int):
        if not 0 <= value <= MAX_GPUS:
            raise ValueError(f"{field}: expected {accepted}, got {value}")
        return value
    if len(value) > MAX_GPUS:
        raise ValueError(f"{field}: {len(value)} ids; expected {accepted}")
    ids: List[str] = []
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool):
            item = str(item)  # an index written as a number (a TOML list, say)
        if not isinstance(item, str):
            raise TypeError(f"{field}: id {item!r:.40} is not a str or an index; expected "
                            f"{accepted}")
        item = item.strip()
        if re.match(ID_PATTERN, item) is None:
            raise ValueError(f"{field}: {item!r:.60} is not a GPU id; expected {accepted}")
        item = str(int(item)) if item.isdigit() else item
        if item in ids:
            raise ValueError(f"{field}: GPU {item} is listed twice; expected {accepted}")
        ids.append(item)
    return tuple(ids)
