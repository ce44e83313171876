"""GPU, engine and host telemetry sampled beside the driver, on the run clock.

`sampler.start_telemetry` is the entry point (docs/telemetry.md). Sources: `nvml` (NVML + GPM),
`smi` (nvidia-smi loop), `scrape` (engine and dcgm-exporter /metrics, parsed by `prometheus`),
`proc` (engine CPU). Nothing is imported here, so `import phaselens.telemetry.prometheus`
stays light for analysis.
"""
