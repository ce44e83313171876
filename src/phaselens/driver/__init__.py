"""The driver: runs a planned Schedule against OpenAI-compatible servers (docs/driver.md).

`drive()` is the whole run (what `phaselens run` calls); `run_schedule()` the async core.
"""

from phaselens.driver.drive import DriveResult, drive
from phaselens.driver.options import DriverOptions
from phaselens.driver.runner import RunSummary, run_schedule
from phaselens.driver.state import LiveStats

__all__ = ["DriveResult", "DriverOptions", "LiveStats", "RunSummary", "drive", "run_schedule"]
