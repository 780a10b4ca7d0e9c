"""Proof that a move of test modules lost no test: the ids collected before the move, mapped
through :data:`support.renames.TEST_MODULES`, equal the ids collected after it (those of the
modules new with the move, :data:`support.renames.ADDED`, set apart and counted).

Usage, from the repository root::

    python -m pytest --collect-only -q -p no:cacheprovider tests > before.txt
    (move the modules)
    python -m pytest --collect-only -q -p no:cacheprovider tests > after.txt
    python tests/support/collection_map.py before.txt after.txt

It prints both counts and every id found on one side only, and exits 1 when the two sorted
lists differ (or either is empty). It only reads files."""

import sys
from pathlib import Path
from typing import List, Mapping, NamedTuple, Optional, Sequence

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.renames import ADDED, TEST_MODULES


def collected_ids(lines: Sequence[str]) -> List[str]:
    """The test ids of ``--collect-only -q`` output (its summary and warnings left out)."""
    return [line.strip() for line in lines if line.startswith("tests/") and "::" in line]


def mapped(test_id: str, renames: Mapping[str, str] = TEST_MODULES) -> str:
    """``test_id`` with its file moved as ``renames`` says (paths relative to tests/)."""
    path, sep, rest = test_id.partition("::")
    relative = path[len("tests/"):]
    return f"tests/{renames.get(relative, relative)}{sep}{rest}"


class Comparison(NamedTuple):
    lost: List[str]  # ids of before, mapped, that after lacks
    new: List[str]  # ids of after that no id of before maps to
    equal: bool  # the two sorted lists are equal (duplicates counted)


def compare(before: Sequence[str], after: Sequence[str],
            renames: Mapping[str, str] = TEST_MODULES) -> Comparison:
    """``before`` mapped through ``renames`` against ``after``."""
    old = sorted(mapped(test_id, renames) for test_id in before)
    new = sorted(after)
    old_set, new_set = set(old), set(new)
    return Comparison([i for i in old if i not in new_set], [i for i in new if i not in old_set],
                      old == new)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: collection_map.py BEFORE AFTER", file=sys.stderr)
        return 2
    before = collected_ids(Path(args[0]).read_text().splitlines())
    after = collected_ids(Path(args[1]).read_text().splitlines())
    added = [test_id for test_id in after if test_id.split("::")[0][len("tests/"):] in ADDED]
    result = compare(before, [test_id for test_id in after if test_id not in added])
    print(f"before: {len(before)} ids; after: {len(after)} ids, of which {len(added)} in "
          f"modules new with the move ({', '.join(ADDED)})")
    for test_id in result.lost:
        print(f"lost: {test_id}")
    for test_id in result.new:
        print(f"new: {test_id}")
    if not before or not after:
        print("an empty collection proves nothing", file=sys.stderr)
        return 1
    if not result.equal:
        return 1
    print("the sorted lists are equal through the rename table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
