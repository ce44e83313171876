"""The driver: runs a planned Schedule against OpenAI-compatible servers (docs/driver.md).

`drive()` is the whole run (what `phaselens run` calls); `run_schedule()` the async core.
"""

from phaselens.driver.drive import DriveResult, drive
from phaselens.driver.runner import DriverOptions, LiveStats, RunSummary, run_schedule

__all__ = ["DriveResult", "DriverOptions", "LiveStats", "RunSummary", "drive", "run_schedule"]
