"""The simulator: a phase-accurate model of LLM serving on GPUs (the embedded default target).

Why a package: policy (engine.py), cost (cost.py) and the event loop (loop.py) stay separate so
each can be tested and fitted on its own (Vidur's split). Entry points live in `run.py`.
The hot modules may be compiled by mypyc at install time; `native.py` picks compiled or
pure-Python imports before any of them loads.
"""

from pathlib import Path

from phaselens.sim.native import select

MODE = select(Path(__file__).parent)
