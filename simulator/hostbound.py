"""Host-bound passes: when the CPU launches a pass's kernels slower than the GPU runs them.

The training frameworks of these runs drive the GPU from one host thread per device: every
operator costs the host a fixed time (Python, the dispatcher, autograd, the kernel launch
through the driver) and enqueues its kernel asynchronously. While kernels are long the host
runs ahead; when a pass is made of kernels shorter than that cost, the GPU waits for the
host (NVIDIA, CUDA Graphs guide, docs.nvidia.com/dl-cuda-graph: the launch-bound regime
CUDA graphs remove; pytorch/ao@624304080 torchao/testing/float8/roofline_utils.py models
the same floor per kernel). The host runs ahead within a pass but not across the pipeline
send or receive that ends it, so a pass takes max(GPU seconds, launches x host seconds per
launch).

Launches per pass of one layer: one per operator of the workload (workload.py) in the
forward pass and in recomputation; in the backward pass two per GEMM (input and weight
gradient), one per other operator; one per exposed TP collective. The host seconds per
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


def host_bound(times, ops, host_s, tp_exposed=(0.0, 0.0), collectives=(0, 0)):
    """The OpsTime of `ops` with each pass at least as long as its launches take the host;
    the difference is booked as forward and input-gradient seconds. `tp_exposed`: exposed
    TP seconds of the passes (the GPU is busy with them), `collectives`: their launches."""
    n_f, n_b = launches(ops)
    idle_f = np.maximum(0.0, (n_f + collectives[0]) * host_s - times.fwd_s - tp_exposed[0])
    idle_b = np.maximum(0.0, (n_b + collectives[1]) * host_s - times.bwd_input_s - times.bwd_weight_s
                        - tp_exposed[1])
    return replace(times, fwd_s=times.fwd_s + idle_f, bwd_input_s=times.bwd_input_s + idle_b)


def rerun_bound(rerun_s, rerun_ops, host_s):
    """Seconds of a layer's recomputation, host-bound like a forward pass."""
    return np.maximum(rerun_s, launches(rerun_ops)[0] * host_s)
