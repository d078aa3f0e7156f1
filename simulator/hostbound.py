"""Host-bound passes: when the CPU launches a pass's kernels slower than the GPU runs them.

The training frameworks of these runs drive the GPU from one host thread per device: every
operator costs the host a fixed time (Python, the dispatcher, autograd, the kernel launch
through the driver) and enqueues its kernel asynchronously. While kernels are long the host
runs ahead; when a pass is made of kernels shorter than that cost, the GPU waits for the
host (NVIDIA, CUDA Graphs guide, docs.nvidia.com/dl-cuda-graph: the launch-bound regime
CUDA graphs remove; pytorch/ao@624304080 torchao/testing/float8/roofline_utils.py models
the same floor per kernel). The host runs ahead within a pass but not across the pipeline
send or receive that ends it, so a pass takes max(GPU seconds, launches x host seconds per
launch). Where the host waits for the device within a pass (an MoE dispatcher copying its
split sizes to the host, moe.dispatch_host_calls), the device then idles until the host has
launched its next kernel, so such a pass takes at least its GPU seconds plus one operator's host
time per wait. A schedule that runs the weight gradients as passes of their own (zero-bubble,
DualPipe-V: Schedule.split_backward) runs a layer's input-gradient and weight-gradient
kernels apart, so each of those passes has its own floor: the weight-gradient pass launches
one GEMM per linear, the input-gradient pass the rest.

Launches per pass of one layer (dense, or MoE and MLA: layermix.py): one per operator of the
workload (workload.py) in the forward pass and in recomputation; in the backward pass two per
GEMM (input and weight gradient), one per other operator; one per TP collective and per MoE
dispatch or combine call. The host seconds per
launch are the node profile's `launch_overhead_us`, per operator of this operator list (a
real framework launches a few kernels per listed operator, which that figure absorbs).

A CPU device has no host to run ahead of: there the framework's cost per operator adds to
the kernel's (the accelerator profile's `op_overhead_us` and `host_overhead_us`, measured by
`llmsim calibrate`; compute.py and framework_ops.py), and its node profile leaves
`launch_overhead_us` at 0. A GPU profile sets the node figure and leaves the others at 0.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .compute import LOW_PRECISION_GEMMS
from .workload import MATMUL


def launches(ops) -> tuple[int, int]:
    """(forward, backward) launches of an operator list: a GEMM launches twice in the backward
    pass, separate projections one GEMM each, a backward-only operator (a gradient sum) none
    in the forward pass."""
    fwd = bwd = 0
    for op in ops:
        n = (len(op.pieces) or 1) * op.launches
        runs_fwd = (op.fwd_flops > 0) | (op.fwd_bytes > 0)
        # an operator with no work in any pass (a batch's plan without context parallelism
        # running the ring's merges) launches nothing; elementwise over a batch of plans
        runs = runs_fwd | (op.bwd_input_flops > 0) | (op.bwd_input_bytes > 0) | (op.bwd_weight_flops > 0) \
            | (op.bwd_weight_bytes > 0)
        fwd = fwd + n * runs_fwd
        bwd = bwd + n * (2 if op.kind == MATMUL or op.kind in LOW_PRECISION_GEMMS else 1) * runs
    return fwd, bwd


def weight_launches(ops):
    """Launches of the weight-gradient GEMMs of an operator list: one per GEMM."""
    return sum((len(op.pieces) or 1) * op.launches * ((op.bwd_weight_flops > 0) | (op.bwd_weight_bytes > 0))
               for op in ops if op.kind == MATMUL or op.kind in LOW_PRECISION_GEMMS)


def host_bound(times, ops, host_s, exposed=(0.0, 0.0), collectives=(0, 0), split=False, waits=0):
    """The OpsTime of `ops` with each pass at least as long as its launches take the host;
    the difference is booked as forward and input-gradient seconds, and with `split` (the
    schedule's weight-gradient passes apart) as weight-gradient seconds for the weight-gradient
    pass's own launches. `exposed`: exposed TP, CP and dispatch seconds of the forward and
    backward passes (the GPU is busy with them), `collectives`: their launches, `waits`: the
    forward pass's waits for the device (one launch of idle device each)."""
    n_f, n_b = launches(ops)
    idle_f = np.maximum(waits * host_s, (n_f + collectives[0]) * host_s - times.fwd_s - exposed[0])
    if split:
        n_w = weight_launches(ops)
        idle_i = np.maximum(0.0, (n_b - n_w + collectives[1]) * host_s - times.bwd_input_s - exposed[1])
        idle_w = np.maximum(0.0, n_w * host_s - times.bwd_weight_s)
        return replace(times, fwd_s=times.fwd_s + idle_f, bwd_input_s=times.bwd_input_s + idle_i,
                       bwd_weight_s=times.bwd_weight_s + idle_w)
    idle_b = np.maximum(0.0, (n_b + collectives[1]) * host_s - times.bwd_input_s - times.bwd_weight_s
                        - exposed[1])
    return replace(times, fwd_s=times.fwd_s + idle_f, bwd_input_s=times.bwd_input_s + idle_b)


def rerun_bound(rerun_s, rerun_ops, host_s, exposed=0.0, collectives=0.0, waits=0.0):
    """Seconds of a layer's recomputation, host-bound like a forward pass (host_bound): with
    the exposed seconds of the exchanges it runs again (`exposed`, booked apart), the launches
    of their collectives (`collectives`) and its waits for the device (`waits`)."""
    return np.maximum(rerun_s + waits * host_s, (launches(rerun_ops)[0] + collectives) * host_s - exposed)


def layer_floors(times, ops, rerun_s, checkpoint, host_s, tp_s, cp_s, ep_s, tp_rerun, plan, shard, split=False,
                 dispatch=(0, 0, 0)):
    """A layer's pass times and its recomputation's seconds at their host floors (host_bound,
    rerun_bound). `tp_s`, `cp_s`, `ep_s`: the (forward, backward) exposed seconds of its TP,
    CP and MoE dispatch exchanges, which keep the GPU busy; its recomputation (`checkpoint`:
    recompute.Checkpoint, `rerun_s` the kernel seconds of what it re-runs) runs `tp_rerun` of
    the forward TP collectives again, and the CP and dispatch exchanges as the checkpoint says.
    A TP collective launches once per all-reduce, all-gather or reduce-scatter: two per pass,
    four with sequence parallelism, and the backward's two re-gathers of the input where the
    framework does not keep it. `dispatch`: an MoE layer's (forward calls, backward calls,
    forward waits) of its dispatch and combine (moe.dispatch_host_calls)."""
    coll = np.where(np.asarray(plan.tp) > 1, 4 if plan.sequence_parallel else 2, 0)
    calls_f, calls_b, waits = dispatch
    if host_s > 0:
        exposed = (tp_s[0] + cp_s[0] + ep_s[0], tp_s[1] + cp_s[1] + ep_s[1])
        launched = (coll + calls_f, coll + calls_b + 2 * plan.sequence_parallel * (not shard.tp_keeps_gathered))
        times = host_bound(times, ops, host_s, exposed, launched, split, waits)
    again = tp_rerun * tp_s[0] + float(checkpoint.cp_rerun) * cp_s[0] + checkpoint.ep_rerun * ep_s[0]
    return times, rerun_bound(rerun_s, checkpoint.rerun, host_s, again, tp_rerun * coll + checkpoint.ep_rerun * calls_f,
                              checkpoint.ep_rerun * waits)
