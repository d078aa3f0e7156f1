"""The input pipeline: loading and preprocessing a step's tokens, and how much of it the
accelerators wait for.

PyTorch's DataLoader runs `num_workers` worker processes per training process; each
prepares whole batches (fetch, decode, collate) one after another, `prefetch_factor`
batches ahead, and the training process copies each batch to the device
(torch/utils/data/dataloader.py; Megatron-LM builds one such loader per rank,
--num-workers default 2). In steady state three stages run concurrently and the slowest
sets the rate, per node:

    storage   tokens · bytes_per_token / min(per-node read rate, total read rate / nodes)
    workers   (requests · (latency + request_bytes / stream rate) + tokens / decode rate)
              / (workers per device · devices per node)      (a worker fetches then decodes)
    copy      tokens per device · host_to_device_bytes_per_token / host link

with the step's tokens spread evenly over the nodes. With workers and prefetch the data
time hides behind the compute step and only the excess stalls the accelerators (the step
becomes max(compute, data)); without them (num_workers 0) loading runs in the training
loop and adds to it. This is the effect measured by the pipeline studies the issue cites:
PRESTO (Isenko et al. 2022, "Where Is My Training Bottleneck?") and the PyTorch
DataLoader study reporting the GPU idle 26 % of the time reading from local disk and 95 %
from object storage.

Broadcast-safe: token counts may be numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

from .bcast import maximum, minimum
from .training import DataPipeline, Dataset, Storage


@dataclass(frozen=True)
class DataTime:
    data_s: object  # seconds per step to deliver a step's batch (the slowest pipeline stage)
    exposed_s: object  # seconds per step the accelerators wait for it
    storage_s: object
    workers_s: object
    copy_s: object


def read_rate(storage: Storage, cluster):
    """Bytes/s one node reads: its own NVMe, or its share of a shared tier."""
    per_node = cluster.node.nvme_read_bytes_per_s if storage.node_nvme else storage.read_bytes_per_s_per_node
    return minimum(per_node, storage.read_bytes_per_s_total / cluster.nodes)


def data_time(tokens_per_step, seq_len, compute_step_s, pipe: DataPipeline, dataset: Dataset, storage: Storage,
              cluster) -> DataTime:
    """Per-step data time and the part the accelerators wait for (module docstring)."""
    tokens = tokens_per_step / cluster.nodes
    workers = max(pipe.workers_per_device, 1) * cluster.devices_per_node
    storage_s = tokens * dataset.storage_bytes_per_token / read_rate(storage, cluster)
    per_request = seq_len if dataset.tokens_per_request is None else dataset.tokens_per_request
    request_s = storage.request_latency_s + per_request * dataset.storage_bytes_per_token / storage.request_bytes_per_s
    workers_s = (tokens / per_request * request_s + tokens / dataset.cpu_tokens_per_s_per_core) / workers
    copy_s = tokens / cluster.devices_per_node * dataset.host_to_device_bytes_per_token / \
        cluster.host_link_bytes_per_s
    data_s = maximum(maximum(storage_s, workers_s), copy_s)
    overlapped = pipe.workers_per_device >= 1 and pipe.prefetch >= 1
    exposed = maximum(0.0, data_s - compute_step_s) if overlapped else data_s
    return DataTime(data_s, exposed, storage_s, workers_s, copy_s)
