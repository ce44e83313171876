"""Command line: thin wrappers that parse arguments and call the modules.

Why thin: every command must be scriptable from Python too; logic lives in the modules.
`app.py` holds the typer app and `main`/`invoke` (one line per failure, exit 2 for bad input);
the commands register on it from `workload.py` (plan, anonymize, run, demo), `views.py`
(analyze, report, trace, compare), `timeline.py`
(timeline), `capacity.py` (capacity), `model.py` (calibrate, whatif),
`sweep.py` (sweep) and `watch.py` (watch), imported below in the order `--help` lists; `args.py`
checks option values and output paths. The command modules import `app` and `args`, never
each other.
"""
# ruff: noqa: I001  (the import order is the order of the commands in --help)

from phaselens.cli.app import app, invoke, main
from phaselens.cli import workload as _workload  # noqa: F401  (plan, anonymize, run, demo)
from phaselens.cli import views as _views  # noqa: F401  (analyze, report, trace, compare)
from phaselens.cli import timeline as _timeline  # noqa: F401  (timeline)
from phaselens.cli import capacity as _capacity  # noqa: F401  (capacity)
from phaselens.cli import model as _model  # noqa: F401  (calibrate, whatif)
from phaselens.cli import sweep as _sweep  # noqa: F401  (sweep)
from phaselens.cli import watch as _watch  # noqa: F401  (watch)

__all__ = ["app", "invoke", "main"]
