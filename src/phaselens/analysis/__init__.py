"""Analysis: pure functions of a loaded `Run` (no I/O). Entry point: `analyze(run)`."""

from phaselens.analysis.findings import CODES, RULES
from phaselens.analysis.summary import analyze, compute

__all__ = ["CODES", "RULES", "analyze", "compute"]
