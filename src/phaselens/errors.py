"""The one exception the CLI turns into a single line and exit code 2.

Why: bad input must never show a traceback. Every module raises `InputError` with the file, the
field path or line number, and what was expected; `cli.py` prints it and exits 2.
"""


class InputError(Exception):
    """Bad user input: a spec, a trace, a deployment file, a run directory, a CLI value."""
