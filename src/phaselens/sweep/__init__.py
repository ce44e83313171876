"""Engine-setting sweeps (docs/capacity.md, "Sweeps"): a fresh engine per setting, each measured
with `capacity`'s instrument. `settings` the `--set` grid and its labels; `launch` an engine
started from a command template and always stopped (its own process group); `measure` one
measurement on a started engine; `predict` the simulator's prediction per setting; `run` the
sweep loop, ranking, the Pareto front and sweep.json.

Why above `capacity`: a sweep uses a capacity search or a fixed-rate probe as its instrument;
nothing in `capacity` knows about sweeps.
"""
