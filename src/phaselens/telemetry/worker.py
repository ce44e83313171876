"""Entry point of the sampler process: `python -m phaselens.telemetry.worker ...`.

Why a plain subprocess and not multiprocessing: spawn re-imports the caller's main module,
which a user's script may not guard; a `-m` entry point imports only phaselens.
"""

import sys

from phaselens.telemetry.sampler import worker_main

if __name__ == "__main__":
    worker_main(sys.argv[1:])
