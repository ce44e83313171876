"""Capacity and settings, measured: capacity searches and engine-setting sweeps on real servers.

Why a layer of its own (between `cliargs` and `whatif`): it drives runs through `execute` and
scores them with `analysis` and the calibrated simulator (`whatif`), and the CLI sits on top.
"""
