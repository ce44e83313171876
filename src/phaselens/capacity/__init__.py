"""Capacity and settings, measured (docs/capacity.md): the highest load, the spec's whole mix
scaled by one factor, a server holds inside its SLO with confidence, and engine settings ranked
by it. `scale` scales a spec, `probe` runs one load and judges it, `search` finds the knee,
`verdict` holds the interval and the queue rules; `engine`/`sweep*` start engines per setting;
`page`/`figures` draw both.

Why a layer of its own (between `cliargs` and `whatif`): it drives runs through `execute` and
scores them with `analysis` and the calibrated simulator (`whatif`); the CLI sits on top.
"""
