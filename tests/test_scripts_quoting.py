"""Quoting of user strings in submit scripts: each context reads the value back exactly."""

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psij._scripts.quoting import (
    ShellWord,
    bash_escape,
    directive_value,
    double_quoted,
    plain_directive_value,
    shell_word,
)
from psij.executors.batch.batch_test_tool import parse_directive_line

HOSTILE = [
    "", " ", "a b", "it's", 'say "hi"', "$(touch pwned)", "`touch pwned`", "${HOME}", "$HOME",
    "back\\slash", "trailing\\", "semi;colon && echo x | cat > y", "glob * ? [a]", "~user",
    "#hash", "tab\there", "new\nline", "unicode é ✓ 日本", "!bang", "'\"'\"'", "a=b", "-n",
]
# Text a shell can carry: no NUL (argv and environment strings end at NUL).
shell_text = st.text(alphabet=st.characters(blacklist_characters="\x00",
                                            blacklist_categories=("Cs",)), max_size=40)


def bash_print(script: str) -> bytes:
    """Runs ``script`` with bash; returns its stdout."""
    return subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout


@pytest.mark.parametrize("value", HOSTILE)
def test_double_quoted_reads_back_exactly(value: str) -> None:
    assert bash_print(f'printf %s "{double_quoted(value)}"') == value.encode()


@pytest.mark.parametrize("value", HOSTILE)
def test_shell_word_is_one_exact_word(value: str) -> None:
    out = bash_print(f"printf '<%s>' {shell_word(value)}")
    assert out == f"<{value}>".encode()


@settings(max_examples=60, deadline=None)
@given(values=st.lists(shell_text, min_size=1, max_size=4))
def test_template_escape_serves_both_contexts(values: list) -> None:
    # One escape function: quoted values and unquoted launch-command words, in one script.
    quoted = " ".join(f'"{bash_escape(v)}"' for v in values)
    words = " ".join(bash_escape(ShellWord(v)) for v in values)
    out = bash_print(f"printf '<%s>' {quoted}; printf '|'; printf '<%s>' {words}")
    expected = "".join(f"<{v}>" for v in values)
    assert out == f"{expected}|{expected}".encode()


@settings(max_examples=200, deadline=None)
@given(value=st.text(alphabet=st.characters(blacklist_characters="\x00\n\r",
                                            blacklist_categories=("Cs",)), max_size=40))
def test_directive_value_is_read_back_by_an_sbatch_style_parser(value: str) -> None:
    line = f' --job-name="{directive_value("JobSpec.name", value)}" --other=x'
    assert parse_directive_line(line) == [f"--job-name={value}", "--other=x"]


@pytest.mark.parametrize("bad,what", [("a\nb", "newline"), ("a\rb", "carriage return"),
                                      ("a\x00b", "NUL")])
def test_directive_value_refuses_line_breaks(bad: str, what: str) -> None:
    with pytest.raises(ValueError, match=f"JobAttributes.account.*{what}"):
        directive_value("JobAttributes.account", bad)


def test_plain_directive_value_accepts_plain_and_names_the_bad_characters() -> None:
    assert plain_directive_value("q", "all.q@node-1") == "all.q@node-1"
    assert plain_directive_value("l", "h_vmem=2G,arch=lx-amd64") == "h_vmem=2G,arch=lx-amd64"
    with pytest.raises(ValueError, match=r"JobAttributes.queue_name.*' '"):
        plain_directive_value("JobAttributes.queue_name", "all q")
    with pytest.raises(ValueError, match="newline"):
        plain_directive_value("x", "a\nb")


def test_numbers_and_plain_words_are_left_alone() -> None:
    assert bash_escape(ShellWord("/usr/bin/env")) == "/usr/bin/env"
    assert bash_escape("12") == "12"
    assert shell_word("") == "''"
