"""Termination classes: from an instance's exit code to why it ended.

A map is written (on the wire and in the journal) as a JSON object whose keys are an exit
code (``"0"``), an inclusive range (``"64-78"``), ``"none"`` (the instance ended without an
exit code: killed by the site, node lost) or ``"default"`` (every other code), and whose
values are class names. A client's map is laid over :data:`DEFAULT_MAP`: the client's keys are
looked at first, then the defaults'; within each, a single code wins over a range that holds
it, and of two ranges the one listed first wins.
"""

from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Tuple

from psij.flows._flow_config import CLASSES

__all__ = ["DEFAULT_MAP", "TerminationMap", "parse_map"]

DEFAULT_MAP: Mapping[str, str] = MappingProxyType({
    "0": "no_problem",
    "75": "no_work",
    "64-74": "failed_init",
    "76-78": "failed_init",
    "126": "failed_init",
    "127": "failed_init",
    "80": "failed_init",
    "81": "failed_after_work",
    "82": "never_claimed",
    "83": "no_work",
    "84": "no_problem",
    "none": "unknown",
    "default": "unknown",
})
"""The default map (the flows guide has it as a table): 0 and 84 "no problem"; 75
(``EX_TEMPFAIL``) and 83 "no work now"; the other ``sysexits.h`` codes 64-78, 126 (not
executable), 127 (not found) and 80 "failed at initialization"; 81 "failed after useful
work"; 82 "never claimed"; anything else, and no exit code at all, "unknown"."""

_CODE_LIMIT = 2**31


class TerminationMap:
    """A parsed map: :meth:`classify` an exit code (or None)."""

    __slots__ = ("default", "layers", "none", "wire")

    def __init__(self, wire: Mapping[str, str],
                 layers: List[Tuple[Dict[int, str], List[Tuple[int, int, str]]]], none: str,
                 default: str) -> None:
        self.wire = dict(wire)
        self.layers = layers
        self.none = none
        self.default = default

    def classify(self, exit_code: Optional[int]) -> str:
        """The class of an instance that ended with ``exit_code``."""
        if exit_code is None:
            return self.none
        for codes, ranges in self.layers:
            found = codes.get(exit_code)
            if found is not None:
                return found
            for low, high, name in ranges:
                if low <= exit_code <= high:
                    return name
        return self.default


def _code(text: str) -> int:
    if not text or len(text) > 11 or not text.lstrip("-").isdigit() or not text.isascii():
        raise ValueError(text)
    value = int(text)
    if not -_CODE_LIMIT < value < _CODE_LIMIT:
        raise ValueError(text)
    return value


def parse_map(value: Any, field: str = "termination_map") -> TerminationMap:
    """``value`` (None or a JSON object as above) laid over the defaults; raises
    ``ValueError`` naming ``field`` and what is accepted."""
    accepted = (f"{field}: expected an object whose keys are an exit code (\"1\"), a range "
                f"(\"64-78\"), \"none\" or \"default\" and whose values are one of "
                f"{', '.join(CLASSES)}")
    if value is None:
        value = {}
    if not isinstance(value, Mapping) or len(value) > 1000:
        raise ValueError(f"{accepted} (at most 1000 keys); got {type(value).__name__}")
    wire: Dict[str, str] = {}
    for key, name in value.items():
        if not isinstance(key, str) or not isinstance(name, str) or name not in CLASSES:
            raise ValueError(f"{accepted}; got {key!r}: {name!r}")
        wire[key] = name
    merged = dict(DEFAULT_MAP)
    merged.update(wire)
    layers = [_layer(wire, accepted), _layer(DEFAULT_MAP, accepted)]
    return TerminationMap(wire, layers, merged["none"], merged["default"])


def _layer(source: Mapping[str, str], accepted: str
           ) -> Tuple[Dict[int, str], List[Tuple[int, int, str]]]:
    codes: Dict[int, str] = {}
    ranges: List[Tuple[int, int, str]] = []
    for key, name in source.items():
        if key in ("none", "default"):
            continue
        try:
            if "-" in key[1:]:
                cut = key.index("-", 1)
                low, high = _code(key[:cut]), _code(key[cut + 1:])
                if low > high:
                    raise ValueError(key)
                ranges.append((low, high, name))
            else:
                codes[_code(key)] = name
        except ValueError:
            raise ValueError(f"{accepted}; got the key {key!r}") from None
    return codes, ranges
