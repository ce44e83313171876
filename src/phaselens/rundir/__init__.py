"""The run directory (docs/run-format.md): what a run leaves on disk, written and read back.

`schema` its files and columns (the record contract with `types.py`); `columns` records checked
and encoded; `write` the crash-safe writer; `eventlog` the append-only log read back; `load` a
run loaded and recovered after a kill; `check` and `colcheck` every file as untrusted input.
`phaselens.load_run` is `load.load_run`.
"""
