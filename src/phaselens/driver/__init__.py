"""The driver: runs a planned Schedule against OpenAI-compatible servers (docs/driver.md).

`drive()` (drive.py) is the whole run, called by `phaselens.execute`'s HttpTarget;
`run_schedule()` (runner.py) the async core. No driver module is imported here: importing one
must not load them all (the simulator's runs import none of them). `phaselens.native` (stdlib
only) picks, before any of them loads, whether the per-read modules it lists (HTTP framing, SSE
parsing) import compiled (mypyc, setup.py) or from their sources.
"""

from pathlib import Path

from phaselens.native import select

MODE = select(Path(__file__).parent, __name__)
