"""phaselens: load-test LLM inference services and explain GPU utilization phase by phase."""

from phaselens.rundir.load import Run, load_run
from phaselens.types import (
    Finding,
    PlannedRequest,
    RequestRecord,
    Schedule,
    StepRecord,
    TelemetrySample,
)

__version__ = "0.1.0"

__all__ = [
    "Finding",
    "PlannedRequest",
    "RequestRecord",
    "Run",
    "Schedule",
    "StepRecord",
    "TelemetrySample",
    "load_run",
]
