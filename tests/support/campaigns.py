"""One campaign per real scheduler for a module of tests: made on its first use for every
scheduler that answers (so that the jobs of Slurm and Grid Engine run at the same time), kept
for the module's other tests, and closed together at the end."""

import threading
from pathlib import Path
from typing import Callable, Dict, Generic, TypeVar

C = TypeVar("C")

SCHEDULER_NAMES = ("slurm", "sge")


class Campaigns(Generic[C]):
    """Campaigns by scheduler name: ``start(name, folder)`` makes one in ``root/name``, for
    each scheduler that ``usable(name)`` says answers."""

    def __init__(self, start: Callable[[str, Path], C], usable: Callable[[str], bool]) -> None:
        self._start = start
        self._usable = usable
        self._lock = threading.Lock()
        self._made: Dict[str, C] = {}

    def get(self, name: str, root: Path) -> C:
        with self._lock:
            if name not in self._made:
                for other in SCHEDULER_NAMES:
                    if other not in self._made and self._usable(other):
                        (root / other).mkdir()
                        self._made[other] = self._start(other, root / other)
            return self._made[name]

    def close_all(self, close: Callable[[C], None]) -> None:
        with self._lock:
            made, self._made = list(self._made.values()), {}
        for campaign in made:
            close(campaign)
