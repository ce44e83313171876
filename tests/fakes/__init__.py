"""The test doubles: stand-ins for what a test cannot (or should not) have for real.

- `fakeserver.py`: an OpenAI-compatible streaming engine (vLLM, llama-server) in its own
  process, for the driver: it reports when it wrote each chunk (timing truth), breaks responses
  on request (`FAULTS`), sends absurd numbers in valid streams (`UNTRUSTED`), and with
  `--slots K` serves K requests at once (llama-server's `-np`), as `phaselens sweep`'s engine.
- `slotserver.py`: an OpenAI-compatible engine whose capacity is known by construction (k slots,
  prefill P, D per token, in virtual time), for the capacity search and the sweep.
- `serve.py`: the start-up those two servers share (127.0.0.1, `PORT <n>` once listening).
- `scripted_transport.py`: the driver's `Transport` (phaselens.driver.transport: connections
  and sockets) played from a script per request, in process: statuses, chunks at exact instants,
  resets, stalls.
- `scripted_engine.py`: an engine's Prometheus `/metrics` endpoint (vLLM's names) following a
  script of phases over time, restarts and outages included, for the watch tests.
- `fake_nvml.py`: the `pynvml` module (nvidia-ml-py): GPUs whose every reading a test sets.
- `promserver.py`: not a double but the harness of a real Prometheus server (started on loopback
  with the shipped rules), the one thing that proves the rules and dashboard queries work.

`FAKESERVER` and `SLOTSERVER` are the two server scripts' paths (they run as `python PATH`).
"""

from pathlib import Path

FAKESERVER = Path(__file__).resolve().with_name("fakeserver.py")
SLOTSERVER = Path(__file__).resolve().with_name("slotserver.py")
