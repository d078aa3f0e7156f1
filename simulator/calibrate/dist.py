"""Local multi-process torch.distributed: a launcher and the collective microbenchmark.

`launch(fn, world_size, ...)` starts `world_size` spawned processes on this machine, each
with `threads` intra-op threads, joined by gloo (CPU) or NCCL (CUDA, one GPU per rank),
runs `fn(rank, world_size, *args)` in each and returns rank 0's result. `fn` must be a
module-level function (spawn pickles it by name).
"""

from __future__ import annotations

import os
import socket
import time
import traceback


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, backend, threads, fn, args, queue):
    import torch
    import torch.distributed as dist

    try:
        from .device import configure

        configure(threads, "cuda" if backend == "nccl" else "cpu")
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        try:
            out = fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
        queue.put((rank, True, out))
    except BaseException:  # report, do not hang the parent
        queue.put((rank, False, traceback.format_exc(limit=5)))


def launch(fn, world_size: int, args: tuple = (), threads: int = 1, device: str = "cpu", timeout_s: float = 900):
    """Run fn(rank, world_size, *args) in `world_size` local processes; rank 0's return value."""
    import torch.multiprocessing as mp

    backend = "nccl" if device == "cuda" else "gloo"
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)  # children inherit it before importing torch
    try:
        procs = [ctx.Process(target=_worker, args=(r, world_size, port, backend, threads, fn, args, queue))
                 for r in range(world_size)]
        for p in procs:
            p.start()
    finally:
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_before
    results, errors = {}, []
    deadline = time.monotonic() + timeout_s
    import queue as _queue

    try:
        while len(results) + len(errors) < world_size:
            try:
                rank, ok, out = queue.get(timeout=1.0)
            except _queue.Empty:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in results]
                if dead:
                    who, code = dead[0], procs[dead[0]].exitcode
                    errors.append(f"measuring process {who} of {world_size} exited with code {code}, no result")
                    break
                if time.monotonic() > deadline:
                    errors.append(f"no result from the {world_size} measuring processes within {timeout_s:.0f} s")
                    break
                continue
            if ok:
                results[rank] = out
            else:  # its traceback: the exception's line first
                errors.append(f"measuring process {rank} of {world_size} failed: {out.strip().splitlines()[-1]}\n{out}")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    if errors:
        from ..errors import MeasurementError
        raise MeasurementError("\n".join(errors))
    return results[0]


# ------------------------------------------------------------------ collective benchmark

def _allreduce_worker(rank, world, sizes, reps, device, clock):
    """All-reduce seconds per message size (timing.estimate); the sizes interleaved (one of each per round)."""
    import torch
    import torch.distributed as dist

    from .timing import CLOCKS, estimate, spread

    now = CLOCKS[clock]
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    bufs = [torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=dev) for nbytes in sizes]
    for buf in bufs:
        for _ in range(2):  # warm-up: connection set-up, buffers
            dist.all_reduce(buf)
    times = [[] for _ in bufs]
    for _ in range(reps):  # the same order on every rank: collectives must match
        for buf, ts in zip(bufs, times):
            dist.barrier()
            t0 = now()
            dist.all_reduce(buf)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            ts.append(now() - t0)
    return [{"op": "all_reduce", "bytes": buf.numel() * 4, "ranks": world, "seconds": estimate(ts),
             "spread": spread(ts)} for buf, ts in zip(bufs, times)]


def collective_samples(device: str = "cpu", quick: bool = False, threads: int = 1, world_size: int = 2,
                       clock: str = "wall") -> list[dict]:
    """All-reduce seconds over message sizes between `world_size` local processes, on
    `clock` (the CPU clock counts what the collective costs the process, not its waiting)."""
    sizes = [2**k for k in ((12, 16, 20, 23) if quick else range(10, 27, 2))]
    reps = 5 if quick else 15
    return launch(_allreduce_worker, world_size, (sizes, reps, device, clock), threads=threads, device=device)


# ------------------------------------------------------------------ devices sharing a node

def _co_run_worker(rank, world, rounds, clock):
    """Seconds of a layer-like probe on rank 0, alone (the other ranks wait) and with every
    rank running it at once; interleaved rounds (timing.estimate)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from .timing import CLOCKS, estimate

    now = CLOCKS[clock]
    x, w, g = torch.randn(512, 256), torch.randn(1024, 256), torch.randn(512, 1024)
    h, big, out = torch.randn(512, 1024), torch.randn(2**21), torch.empty(2**21)
    ln = torch.nn.LayerNorm(256)

    def probe():  # a layer's kinds of work: GEMMs, elementwise, a norm, a copy beyond the private cache
        for _ in range(4):
            F.linear(x, w)
            g @ w
            g.t() @ x
            F.gelu(h)
            ln(x)
            out.copy_(big)

    probe()
    times = {"alone": [], "together": []}
    for _ in range(rounds):
        for mode in times:
            dist.barrier()
            if mode == "alone" and rank > 0:
                continue
            t0 = now()
            probe()
            times[mode].append(now() - t0)
    return {k: estimate(v) for k, v in times.items()} if rank == 0 else None


def co_run_slowdown(threads: int = 1, world_size: int = 2, clock: str = "wall", quick: bool = False) -> dict:
    """How much slower a CPU device runs while the node's other devices run too (shared caches,
    memory bandwidth, SMT siblings): the probe's time with all `world_size` devices busy
    over its time alone, minus 1 (hardware.Accelerator.co_run_slowdown)."""
    t = launch(_co_run_worker, world_size, (5 if quick else 15, clock), threads=threads, device="cpu")
    return {"alone_s": t["alone"], "together_s": t["together"],
            "slowdown": max(0.0, t["together"] / t["alone"] - 1.0)}
