"""The driver: runs a planned Schedule against OpenAI-compatible servers (docs/driver.md).

`drive()` (drive.py) is the whole run, called by `phaselens.execute`'s HttpTarget;
`run_schedule()` (runner.py) the async core. Nothing is imported here: importing one driver
module must not load them all (the simulator's runs import none of them).
"""
