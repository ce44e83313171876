"""The one exception the CLI turns into a single line and exit code 2, and how a line is made.

Why: bad input must never show a traceback. Every module raises `InputError` with the file, the
field path or line number, and what was expected; `cli/app.py` prints it and exits 2.
"""

from __future__ import annotations

#: Longest message the CLI prints: an error line must fit a terminal's scrollback, not 500 MB.
MAX_MESSAGE_CHARS = 300


class InputError(Exception):
    """Bad user input: a spec, a trace, a deployment file, a run directory, a CLI value."""


def one_line(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`message` as one printable line of at most `limit` characters.

    Why: a message may quote user input (a name with newlines, escape sequences, megabytes of
    YAML); the error line must stay one line that a terminal shows as it is.
    """
    head = message[: limit * 4]
    text = " ".join(
        "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in part)
        for part in head.split()
    )
    if len(text) > limit or len(message) > len(head):
        text = text[: limit - 1].rstrip() + "…"
    return text
