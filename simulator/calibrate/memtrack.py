"""Peak memory of live tensors during a callable.

CUDA: torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus what was
allocated before, plus the `baseline` bytes the caller says are live.

CPU: torch has no max_memory_allocated on CPU. The profiler with profile_memory=True
records every allocation and free of a tensor's storage ("[memory]" events, positive
and negative byte counts, with timestamps). Sorted by time, their running sum is the
change in live tensor bytes; its maximum over the call plus the bytes already live
when it started (`baseline`: parameters, gradients, optimizer states, the batch) is the
peak of live tensor bytes. Allocator slack, fragmentation and the process's own memory
(libraries, interpreter) are not tensor bytes and are not counted, which is what the
simulator's weights + gradients + optimizer + activations describe.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile


# Lines the profiler's library (kineto) writes to the process's stderr at every start and stop
# ("USDT: ... profiler_start"), whatever its log level: not messages for a user.
_PROFILER_NOISE = ("USDT:", "STAGE:")


@contextlib.contextmanager
def _quiet_profiler():
    """Run a block with file descriptor 2 captured; give back what it wrote, less the profiler's lines."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [ln for ln in tmp.read().decode(errors="replace").splitlines(keepends=True)
                    if not ln.startswith(_PROFILER_NOISE)]
            if kept:
                sys.stderr.write("".join(kept))


def peak_delta_cpu(fn) -> int:
    """Maximum increase of live tensor bytes while fn() runs on the CPU (profiler events)."""
    from torch.profiler import ProfilerActivity, profile

    with _quiet_profiler(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.device_type().name == "CPU"]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def peak_delta_cuda(fn) -> int:
    import torch

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def peak_live_bytes(fn, baseline: int, device: str = "cpu") -> int:
    """Peak live tensor bytes during fn(): `baseline` (already live) plus the peak increase."""
    delta = peak_delta_cuda(fn) if device == "cuda" else peak_delta_cpu(fn)
    return int(baseline + max(0, delta))


def tensor_bytes(tensors) -> int:
    """Bytes of distinct storages among `tensors` (views of one buffer count once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        key = st.data_ptr()
        if key not in seen:
            seen.add(key)
            total += st.nbytes()
    return total
