"""The jobs a ``psij`` command line names, found the way users name them.

Every command that takes job ids (``status``, ``wait``, ``cancel``, ``priority``, ``release``)
turns each word it is given into one recorded job here, by these rules, in this order:

1. a word that is a recorded job's whole psij id names that job;
2. otherwise the word names every job it may stand for: a job whose psij id begins with it
   (when it has at least :data:`MIN_PREFIX` characters), a job whose native id (the
   scheduler's job id, as ``psij list`` shows it) is the word, and, spelled as another
   scheduler writes it, an array element (``123_4``, ``123[4]`` and ``123.4`` are the same
   element); a bare job number also names a PBS job recorded with its server (``123`` for
   ``123.server``) and, when no job has it as its native id, the elements of that array;
3. one job so named is the job; none is an error ("no recorded job ..."), and several are an
   error listing each (id, executor, native id, state), so that a word never picks one of
   several jobs by chance: an id prefix that is also another job's native id is refused too.

A word that cannot be an id (empty, with spaces or control characters, not valid text, longer
than :data:`MAX_WORD` characters) is refused before the registry is read. Every error is a
ValueError whose message names the word; the commands report it as a usage error (exit status
2). The words are compared as plain text (never as a pattern): ``%``, ``_`` and ``*`` are
characters like any other.

Imported by :mod:`psij.cli._jobs` and :mod:`psij.cli._release`; it reads the registry through
:mod:`psij.registry` and :mod:`psij._registry.store`.
"""

import re
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["MAX_WORD", "MIN_PREFIX", "resolve"]

MIN_PREFIX = 4  # the shortest prefix of a psij id taken for it
MAX_WORD = 256  # the longest word taken for an id (psij ids have 36 characters)
_SHOWN = 10  # the most candidates an ambiguity error lists

# An array element's native id as schedulers write it: Slurm 123_4, PBS and LSF 123[4] (PBS
# with its server after it: 123[4].server), Grid Engine 123.4.
_ELEMENT = re.compile(r"(\d+)(?:_(\d+)|\[(\d+)\](?:\..*)?|\.(\d+))", re.DOTALL)
_NUMBER = re.compile(r"\d+")
# A PBS job recorded with its server: 123.server (a server name does not begin with a digit).
_WITH_SERVER = re.compile(r"(\d+)\.\D.*", re.DOTALL)

# The registry's columns a candidate is described with.
_COLUMNS = ("id", "executor", "native_id", "state")


def check_word(word: str) -> None:
    """ValueError naming ``word`` unless it could be a job's id or native id."""
    shown = repr(word[:40]) + ("..." if len(word) > 40 else "")
    if not word:
        raise ValueError("ID: an empty id names no job; give a psij id, a prefix of one "
                         f"({MIN_PREFIX} characters or more) or a native id")
    if len(word) > MAX_WORD:
        raise ValueError(f"ID {shown}: {len(word)} characters; an id has at most {MAX_WORD}")
    try:
        word.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"ID {shown}: not valid text (the command line had bytes that are "
                         "not UTF-8)") from None
    if any(c.isspace() or not c.isprintable() for c in word):
        raise ValueError(f"ID {shown}: contains a space or a control character; no job id "
                         "or native id does")


def _element(native_id: str) -> Optional[Tuple[str, str]]:
    """(job number, index) of an array element's native id, in any scheduler's spelling."""
    match = _ELEMENT.fullmatch(native_id)
    if match is None:
        return None
    index = next(g for g in match.groups()[1:] if g is not None)
    return match.group(1), str(int(index))


def _number(word: str) -> Optional[str]:
    """The job number ``word`` holds, when it is one or an array element's native id."""
    if _NUMBER.fullmatch(word):
        return word
    element = _element(word)
    return None if element is None else element[0]


def _candidates(word: str, rows: Sequence[Tuple[str, ...]]) -> List[Tuple[str, ...]]:
    """The rows (of ``_COLUMNS``) ``word`` names by rule 2, each job once, oldest first."""
    element = _element(word)
    bare = _NUMBER.fullmatch(word) is not None
    exact_native = any(r[2] == word for r in rows)
    named = []
    for row in rows:
        job_id, native = row[0], row[2]
        if len(word) >= MIN_PREFIX and job_id.startswith(word):
            named.append(row)
        elif not isinstance(native, str):
            continue
        elif native == word:
            named.append(row)
        elif element is not None and _element(native) == element:
            named.append(row)
        elif bare and _WITH_SERVER.fullmatch(native) and native.split(".", 1)[0] == word:
            named.append(row)
        elif bare and not exact_native and (_element(native) or ("",))[0] == word:
            named.append(row)
    return named


class _Index:
    """Every recorded job (rows of ``_COLUMNS``, oldest first), read once and indexed by what
    a word may name, for a command line naming many jobs (one read of the registry instead of
    one per word)."""

    def __init__(self, rows: Sequence[Tuple[str, ...]]) -> None:
        self.rows = rows
        self.by_start: Dict[str, List[int]] = {}  # by the first MIN_PREFIX characters of ids
        self.by_native: Dict[str, List[int]] = {}
        self.by_number: Dict[str, List[int]] = {}
        for at, row in enumerate(rows):
            self.by_start.setdefault(row[0][:MIN_PREFIX], []).append(at)
            native = row[2]
            if not isinstance(native, str):
                continue
            self.by_native.setdefault(native, []).append(at)
            # Its leading job number, if it has one (more rows than a word names: it is only
            # where _candidates looks), found without a pattern: one per recorded job.
            number = native.partition("_")[0].partition("[")[0].partition(".")[0]
            if number.isdigit():
                self.by_number.setdefault(number, []).append(at)

    def rows_for(self, word: str) -> List[Tuple[str, ...]]:
        """The rows :meth:`Store.named <psij._registry.store.Store.named>` gives for
        ``word``, or more (:func:`_candidates` takes those it names)."""
        found = set(self.by_native.get(word, ()))
        number = _number(word)
        if number is not None:
            found.update(self.by_number.get(number, ()))
        if len(word) >= MIN_PREFIX:
            found.update(self.by_start.get(word[:MIN_PREFIX], ()))
        return [self.rows[at] for at in sorted(found)]


# Words not found whole from which the registry is read once and indexed: on 100,000 jobs one
# word costs a scan of some 30 ms, the read and index some 500 ms (bench/registry.py's fill).
_INDEX_FROM = 20


def _describe(row: Tuple[str, ...]) -> str:
    return f"{row[0]} ({row[1]}, native id {row[2] or '-'}, {row[3]})"


def resolve(words: Sequence[str]) -> List[str]:
    """The psij ids of the recorded jobs ``words`` name (see the module's rules), in the order
    named, each once. ValueError naming each word that names no job or several."""
    from psij import registry
    from psij._registry.store import open_store

    if not words:
        return []
    for word in words:
        check_word(word)
    _, rows = registry._select(list(dict.fromkeys(words)), None, None, None, None, ("id",))
    exact = {r[0] for r in rows}
    found: Dict[str, str] = {w: w for w in words if w in exact}
    missing: List[str] = []
    ambiguous: List[str] = []
    store = open_store(registry._work_directory(None))
    pending = list(dict.fromkeys(w for w in words if w not in found))
    index = _Index(store.select(columns=_COLUMNS)) if len(pending) >= _INDEX_FROM else None
    for word in pending:
        rows = index.rows_for(word) if index is not None else \
            store.named(word, MIN_PREFIX, _number(word), _COLUMNS)
        named = _candidates(word, rows)
        if len(named) == 1:
            found[word] = named[0][0]
        elif not named:
            missing.append(word)
        else:
            listed = "; ".join(_describe(r) for r in named[:_SHOWN])
            more = f"; and {len(named) - _SHOWN} more" if len(named) > _SHOWN else ""
            ambiguous.append(f"ID {word!r} names {len(named)} recorded jobs: {listed}{more}")
    problems = ambiguous
    if missing:
        problems = [f"no recorded job with id {', '.join(missing)} (nor with "
                    f"{'it' if len(missing) == 1 else 'them'} as the beginning of an id, of "
                    f"{MIN_PREFIX} characters or more, or as a native id)", *problems]
    if problems:
        if ambiguous:
            problems.append("name one of them by its whole psij id (or use --tag)")
        raise ValueError("; ".join(problems))
    return list(dict.fromkeys(found[w] for w in words))
