"""Capacity, measured (docs/capacity.md): the highest load, the spec's whole mix scaled by one
factor, a server holds inside its SLO with confidence. `config` the search's settings; `scale`
scales a spec; `probe` runs one load and judges it (`transient`, `verdict`, `autocorr`);
`predict`, `queuemodel`, `blindband`, `fanout` predict the knee; `search` finds it, with
`nextprobe` choosing each next load and `explain` saying why none passed; `result` is
capacity.json.

Why a layer of its own (above `whatif`, below `sweep` and `cli`): it drives runs through
`execute` and scores them with `analysis` and the calibrated simulator (`whatif`); engine
sweeps (`sweep/`) use it as their instrument; its pages are drawn by `report/`.
"""
