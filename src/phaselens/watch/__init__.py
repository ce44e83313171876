"""`phaselens watch`: attach to running engines and GPUs, no load sent (docs/watch.md).

`loop.watch(WatchConfig)` is the entry point. Modules: `config` (`WatchConfig`, `WatchResult`),
`engines` (the scraped engines and their histograms), `state` (100 ms bins in rings),
`indicators` (the live figures per window), `rules` (live findings), `hysteresis` (when they
raise and clear), `exporter` (Prometheus), `panel` (the terminal), `record` (--record run
directories, opened through `execute.open_recording`), `sidecar` (`run --listen`'s watcher
process).
"""
