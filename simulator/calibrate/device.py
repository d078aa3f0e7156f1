"""One calibrated "device": the execution settings shared by every process that measures it.

`llmsim calibrate` and `llmsim validate --torch` must run the same device, or what the
microbenchmarks measure is not what a training step pays. Each process that times work
(the calibrating process, every collective and training worker) calls `configure` first:

- intra-op threads: `threads` per device (torch.set_num_threads);
- subnormal floats flushed to zero (torch.set_flush_denormal): Intel cores process SIMD
  floating-point operations with subnormal operands through a microcode assist, tens of
  times slower (Intel 64 and IA-32 Architectures Optimization Reference Manual, "Floating-
  point exceptions / denormals"); microbenchmarks on random data never see subnormals, so a
  step that produces them would run a different, slower path than the one calibrated
  (docs/calibration.md, "Why the Intel machine missed by 6x");
- freed memory kept by the allocator (glibc mallopt M_TRIM_THRESHOLD, M_MMAP_THRESHOLD):
  otherwise glibc returns large freed blocks to the kernel and the next allocation of the
  same size page-faults and zero-fills every page, which a microbenchmark repeating one
  operation never pays but a training step, allocating many sizes, pays at random. A GPU
  framework's caching allocator keeps its blocks the same way.
"""

from __future__ import annotations

import ctypes
import platform

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_KEEP_BYTES = 2**30


def _keep_freed_memory() -> str:
    """Ask glibc malloc not to return freed memory to the kernel; what was set, for the record."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "default (not glibc)"
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return "default (libc not loadable)"
    ok = libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES) == 1
    # mmap threshold: glibc caps it (32 MiB on 64-bit builds); try the large value, then the cap
    ok = ok and (libc.mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES) == 1 or libc.mallopt(_M_MMAP_THRESHOLD, 2**25) == 1)
    return "glibc keeps freed memory (mallopt trim and mmap thresholds raised)" if ok else "default (mallopt refused)"


def configure(threads: int, device: str = "cpu") -> dict:
    """Apply the device's settings in this process; returns them (recorded in the profile)."""
    import torch

    torch.set_num_threads(threads)
    flush = bool(torch.set_flush_denormal(True))
    settings = {"threads": threads, "flush_denormal": flush}
    if device == "cpu":
        settings["allocator"] = _keep_freed_memory()
    return settings
