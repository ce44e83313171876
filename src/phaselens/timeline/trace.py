"""The columns kept from a profiler trace: device ops, runtime calls and annotations.

Why columns (numpy) and not event dicts: an engine's trace holds millions of events; the steps
and holes are computed with vector operations over these arrays, and memory stays bounded by
the kept events (a few int64 columns each), not by the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]

# Event kinds (the `kind` column).
KERNEL = 0
MEMCPY = 1
MEMSET = 2
RUNTIME = 3  # cuda_runtime / cuda_driver (and HIP's, which Kineto files under the same names)
ANNOTATION = 4  # user_annotation: a CPU-side record_function range (the engine's step label)
GPU_ANNOTATION = 5  # gpu_user_annotation: the same range projected onto a stream

#: Kineto category -> kind. ROCm traces use the CUDA names; old Kineto capitalised some.
CATEGORY_KIND: dict[str, int] = {
    "kernel": KERNEL,
    "Kernel": KERNEL,
    "gpu_memcpy": MEMCPY,
    "Memcpy": MEMCPY,
    "gpu_memset": MEMSET,
    "Memset": MEMSET,
    "cuda_runtime": RUNTIME,
    "cuda_driver": RUNTIME,
    "Runtime": RUNTIME,
    "Driver": RUNTIME,
    "hip_runtime": RUNTIME,
    "hip_driver": RUNTIME,
    "user_annotation": ANNOTATION,
    "gpu_user_annotation": GPU_ANNOTATION,
}

DEVICE_KINDS = (KERNEL, MEMCPY, MEMSET)
#: Kept events at the most (PHASELENS_LIMIT_TRACE_EVENTS): ~90 bytes of columns each.
MAX_KEPT_EVENTS = 50_000_000


@dataclass(frozen=True)
class Events:
    """Kept events, one row each, in file order. Missing integers are -1.

    start_ns: trace-relative ns (round(ts * 1000)); add `TraceFile.base_ns` for epoch ns.
    stream: -1 for host events. correlation: runtime call <-> device op link (-1 none).
    external: the `External id` (cpu_op <-> runtime link; -1 none). nbytes: memcpy/memset size.
    """

    kind: I8
    name: list[str]
    start_ns: I64
    dur_ns: I64
    stream: I64
    correlation: I64
    external: I64
    device: I64
    pid: I64
    tid: I64
    nbytes: I64

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    @property
    def end_ns(self) -> I64:
        """start + duration, trace-relative ns."""
        return self.start_ns + self.dur_ns


@dataclass(frozen=True)
class TraceFile:
    """One rank's profiler trace, read once.

    base_ns: `baseTimeNanoseconds` (epoch ns of ts 0), None when the file has none.
    dropped: events not kept, counted per category (cpu_op, python_function, ac2g, ...).
    total_events: every entry of `traceEvents`, kept or not.
    """

    path: Path
    base_ns: int | None
    rank: int
    engine: str | None
    device: str | None
    events: Events
    dropped: dict[str, int]
    total_events: int

    @property
    def offset_ns(self) -> int:
        """What turns a trace-relative ns into the column's ns (epoch when the base is known)."""
        return self.base_ns or 0
