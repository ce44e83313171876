"""Inside the step (issue 29): engines' profiler traces read into labelled steps and holes.

`read_trace` streams a Kineto trace (or reads an Nsight Systems SQLite export: `read_nsys`,
one device at a time with `device=`); `step_table` gives one row per engine step with its busy
time and its idle time by cause; `gaps_table` every idle interval; `whole_trace` the totals as
HTA and TraceLens compute them.
"""

from phaselens.timeline.annotations import StepLabel, parse_step
from phaselens.timeline.holes import CAUSES, gaps_table, step_table
from phaselens.timeline.kineto import read_trace
from phaselens.timeline.nsys import nsys_devices, read_nsys
from phaselens.timeline.steps import unlabelled_reason
from phaselens.timeline.totals import whole_trace
from phaselens.timeline.trace import Events, TraceFile

__all__ = [
    "CAUSES",
    "Events",
    "StepLabel",
    "TraceFile",
    "gaps_table",
    "nsys_devices",
    "parse_step",
    "read_nsys",
    "read_trace",
    "step_table",
    "unlabelled_reason",
    "whole_trace",
]
