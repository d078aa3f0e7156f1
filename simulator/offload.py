"""CPU and NVMe offload: what crosses the host link, how long it takes, what it cannot hide.

One model for both engines. Each device's host link (PCIe) is full duplex: copies to the
host (D2H) and from it (H2D) run on two in-order streams of their own, shared by every
transfer of that direction (activations, weights, optimizer copies). The devices behind one
PCIe uplink to host memory share it (node `devices_per_host_link`: two GPUs per PCIe
switch on DGX nodes), as the symmetric ranks of a step copy at the same time. NVMe
bandwidth is the node's, shared by its devices. Not modelled: the GPUDirect RDMA traffic of
the NICs behind the same switches (switch-local, it does not cross the uplink but shares the
GPU's x16 link), and the hosts' DRAM bandwidth.

- Activations (checkpoint offload): a chunk's saved activations go D2H after its forward
  pass and come back H2D, issued one pass ahead of its backward pass; a chunk whose
  backward pass is the very next pass stays on the device.
- ZeRO-Infinity (Rajbhandari et al. 2021) weights: each device's shard streams H2D one pass
  ahead of the forward and of the backward pass, every micro-batch.
- ZeRO-Offload (Ren et al. 2021): per step the gradients go D2H, the host's CPU Adam
  updates the states (its rate a node-profile figure shared by the node's devices; with
  NVMe, the states are read and written there too), the weights come back H2D.

Exposure (analytic engine): per micro-batch, what the busier direction moves beyond the
micro-batch's compute (the copies overlap any pass); per step, the whole optimizer chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .hardware import Cluster
from .states import BytesPerParam, ModelStates


@dataclass(frozen=True)
class OffloadCosts:
    """Seconds of one device's host traffic."""

    activations_d2h_s: object  # per chunk pass (forward), of one micro-batch
    activations_h2d_s: object  # per chunk pass (backward)
    weights_h2d_s: object  # per chunk pass, forward and backward alike (ZeRO-Infinity)
    gradients_d2h_s: object  # per step (ZeRO-Offload)
    host_adam_s: object  # per step, CPU Adam and NVMe state traffic
    weights_back_h2d_s: object  # per step, updated weights back to the device

    @property
    def per_step_s(self):
        return self.gradients_d2h_s + self.host_adam_s + self.weights_back_h2d_s


def offload_costs(plan, cluster: Cluster, params, states: ModelStates, per: BytesPerParam, chunk_act_bytes,
                  chunks: int, shard_group) -> OffloadCosts:
    """Transfer and host seconds of a device holding `params` (before ZeRO sharding)."""
    off, node = plan.offload, cluster.node
    host = cluster.host_link_bytes_per_s
    nvme_read = node.nvme_read_bytes_per_s / cluster.devices_per_node
    nvme_write = node.nvme_write_bytes_per_s / cluster.devices_per_node
    zero = 0.0 * params
    act_out = act_in = weights_in = grads_out = adam = back = zero
    if off.activations != "none":
        out_rate = host if off.activations == "cpu" else np.minimum(host, nvme_write)
        in_rate = host if off.activations == "cpu" else np.minimum(host, nvme_read)
        act_out, act_in = chunk_act_bytes / out_rate, chunk_act_bytes / in_rate
    if off.params != "none":
        rate = host if off.params == "cpu" else np.minimum(host, nvme_read)
        weights_in = params / shard_group * per.weight / chunks / rate
    if off.optimizer != "none":
        local = states.local_params
        grads_out = local * per.grad / host
        back = local * per.weight / host
        adam = local * cluster.devices_per_node / node.host_adam_params_per_s
        if off.optimizer == "nvme":
            state = local * per.optimizer
            adam = adam + state / nvme_read + state / nvme_write
    return OffloadCosts(act_out, act_in, weights_in, grads_out, adam, back)


def exposed_offload_s(costs: OffloadCosts, chunks: int, microbatches, offloaded_chunks: tuple, forward_chunk_s,
                      backward_chunk_s, stage_s, period_s):
    """Seconds per step the offload transfers add (analytic engine), the larger of two bounds:
    latency, each read issued one pass ahead waits beyond the pass it overlaps (a forward or a
    backward pass: `offloaded_chunks` counts both, schedules.offloaded_in_order), less the
    slack the stage has per micro-batch against the pipeline's period (`period_s`, the
    slowest stage's micro-batch; `stage_s`, this stage's); throughput, the busier direction's
    total beyond the step's period. Plus the per-step optimizer chain, which nothing overlaps."""
    during_fwd, during_bwd = offloaded_chunks
    offloaded = during_fwd + during_bwd
    passes = 2 * microbatches * chunks
    weights = costs.weights_h2d_s
    read = costs.activations_h2d_s + weights
    waits = (during_fwd * np.maximum(0.0, read - forward_chunk_s) + during_bwd * np.maximum(0.0, read - backward_chunk_s)
             + (passes - offloaded) * np.maximum(0.0, weights - forward_chunk_s))
    latency = microbatches * np.maximum(0.0, waits / microbatches - (period_s - stage_s))
    d2h = offloaded * costs.activations_d2h_s
    h2d = offloaded * costs.activations_h2d_s + passes * weights
    throughput = np.maximum(0.0, np.maximum(d2h, h2d) - microbatches * period_s)
    return np.maximum(latency, throughput) + costs.per_step_s


def resident_chunks_with_offload(costs: OffloadCosts, in_flight_chunks, forward_chunk_s):
    """Chunks an offloading stage holds at its peak: the one in use, the one being read back,
    the one being copied out, and, when a copy out takes longer than a forward pass, the
    backlog that a run of forward passes leaves: 1 - f/copy of each chunk in flight."""
    behind = np.maximum(0.0, 1.0 - forward_chunk_s / np.maximum(np.asarray(costs.activations_d2h_s), 1e-30))
    return np.minimum(in_flight_chunks, 2 + np.maximum(1, np.ceil(in_flight_chunks * behind)))
