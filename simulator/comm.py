"""Collective communication times: alpha-beta model per link, ring / tree, hierarchical.

Bus-bandwidth convention of nccl-tests (NVIDIA, doc/PERFORMANCE.md): a ring all-reduce
of S bytes over n ranks moves 2(n-1)/n·S per rank, all-gather and reduce-scatter
(n-1)/n·S (S = the full, gathered size), so time = factor·S / busbw. The profile's link
efficiency is the measured busbw divided by the line rate. Latency: alpha per step,
2(n-1) steps for a ring all-reduce, 2·log2(n) for a (double binary) tree.

Placement: ranks are laid out innermost-first in `rank_order` (default tp-cp-dp-pp), so a
group of dimension X has its members `stride` ranks apart, stride being the product of
the dimensions inside X. Members inside one scale-up domain (NVLink / ICI island) use
scale-up links; a group spanning domains runs hierarchically: reduce-scatter inside the
domain, all-reduce of the 1/g shard across domains over each device's share of the NICs,
all-gather inside the domain (the algorithm NCCL's tree and CollNet variants follow). An
all-reduce inside one NVSwitch domain with in-switch reduction (NVLink SHARP: H100 and later)
runs as NCCL's NVLS algorithm where that is faster (_nvls_all_reduce); across domains NCCL's
NVLSTree is not modelled (the ring/tree path stands). On a switchless full mesh (AMD xGMI,
Gaudi's on-die RoCE) a group inside the domain uses only the links to its own members
(scaleup_for).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .bcast import as_float, maximum, minimum, where
from .hardware import Cluster, Link


@dataclass(frozen=True)
class Placement:
    """A group of `size` ranks: `local` of them per scale-up domain, spread over `domains`."""

    size: object
    local: object
    domains: object


def placement(sizes: dict, dims, order: str, domain: int) -> Placement:
    """Where the members of one group sit. `dims` is a dimension ("tp") or adjacent dimensions
    (("cp", "dp")) forming one group; `sizes` gives every dimension's size."""
    dims = (dims,) if isinstance(dims, str) else tuple(dims)
    names = order.split("-")
    first = min(names.index(d) for d in dims)
    stride, n = 1, 1
    for name in names[:first]:
        stride = stride * sizes[name]
    for d in dims:
        n = n * sizes[d]
    per_domain = where(stride <= domain, maximum(1, domain // stride), 1)
    local = minimum(n, per_domain)
    return Placement(size=n, local=local, domains=np.ceil(n / local))


def scaleup_for(cluster: Cluster, members):
    """The scale-up link as a group with `members` devices in one domain sees it. Behind a
    switch (NVSwitch) any pair of devices drives the whole link. On a full mesh each pair has
    its own link, 1/(D - 1) of a device's bandwidth over D devices, so a group uses only the
    links to its own members, (members - 1)/(D - 1) of it: on 8 MI300X, 64 GB/s per peer and
    448 GB/s in all, RCCL's all-reduce bus bandwidth is 47.7 GB/s on 2 GPUs and 312.9 GB/s on
    8 (stas00/ml-engineering@744d01e network/README.md, "Peer-to-peer bandwidth", 4 GiB)."""
    up = cluster.node.scaleup
    if not up.full_mesh:
        return up
    peers = max(cluster.node.scaleup_domain - 1, 1)
    share = minimum(1.0, maximum(as_float(members) - 1, 1.0) / peers)
    return replace(up, bytes_per_s=up.bytes_per_s * share)


_RING_FACTOR = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}


def _ring(kind: str, nbytes, n, link: Link):
    n = as_float(n)
    factor = _RING_FACTOR[kind]
    steps = factor * (n - 1)
    t = steps * link.latency_s + factor * (n - 1) / maximum(n, 1.0) * nbytes / link.bus_bytes_per_s
    return where(n > 1, t, 0.0)


def _tree_all_reduce(nbytes, n, link: Link):
    n = as_float(n)
    t = 2 * np.ceil(np.log2(maximum(n, 1.0))) * link.latency_s + 2 * nbytes / link.bus_bytes_per_s
    return where(n > 1, t, 0.0)


def _nvls_all_reduce(nbytes, n, link: Link):
    """NVLink SHARP (hardware.Nvls): S / (algorithm bandwidth) after one fixed latency, for
    groups NCCL runs it on; infinite elsewhere. NCCL's tuning model has the same form, a
    constant NVLS bus bandwidth per channel and 25 us of latency per collective over NVLink
    (NVIDIA/nccl@5067397c src/graph/tuning.cc nvlsEfficiency, hwLatencies NVLS Simple)."""
    nv = link.nvls
    if nv is None:
        return np.inf
    return where(as_float(n) >= nv.min_devices, nv.latency_s + nbytes / (link.bytes_per_s * nv.efficiency), np.inf)


def collective_time(kind: str, nbytes, group: Placement, cluster: Cluster):
    """Seconds for one collective of `nbytes` (full size) over a placed group.

    kind: all_reduce | all_gather | reduce_scatter.
    """
    g, k = group.local, group.domains
    up, out = scaleup_for(cluster, g), cluster.scaleout
    if kind == "all_reduce":
        flat_up = minimum(minimum(_ring(kind, nbytes, g, up), _tree_all_reduce(nbytes, g, up)),
                          _nvls_all_reduce(nbytes, g, up))
        across = minimum(_ring(kind, nbytes / g, k, out), _tree_all_reduce(nbytes / g, k, out))
        hier = _ring("reduce_scatter", nbytes, g, up) + across + _ring("all_gather", nbytes, g, up)
    else:
        flat_up = _ring(kind, nbytes, g, up)
        hier = _ring(kind, nbytes, g, up) + _ring(kind, nbytes / g, k, out)
    return where(k > 1, hier, flat_up)


def send_recv_time(nbytes, crosses_domain, cluster: Cluster):
    """Point-to-point transfer between neighbouring pipeline stages."""
    up, out = scaleup_for(cluster, 2), cluster.scaleout
    t_up = up.latency_s + nbytes / up.bus_bytes_per_s
    t_out = out.latency_s + nbytes / out.bus_bytes_per_s
    return where(crosses_domain, t_out, t_up)


def all_to_all_time(nbytes, group: Placement, cluster: Cluster):
    """Seconds for an all-to-all in which every rank scatters `nbytes` evenly over the group
    (its own 1/n share stays put).

    Pairwise exchange (Thakur, Rabenseifner and Gropp 2005, "Optimization of Collective
    Communication Operations in MPICH", IJHPCA 19(1), Sec. 3.4): n-1 steps, each rank sends
    S/n to one peer per step: (n-1)·alpha + (n-1)/n·S/B. nccl-tests reports the same
    (n-1)/n·S per rank as all-to-all bus bandwidth (NVIDIA/nccl-tests doc/PERFORMANCE.md,
    "alltoall": busBw = algBw·(n-1)/n). Across scale-up domains NCCL posts every peer's
    send and receive at once (ncclGroupStart/End around ncclSend/ncclRecv): the shares for
    the g-1 peers of the rank's own domain cross the scale-up links while those for the n-g
    peers elsewhere cross the rank's share of the NICs, at the same time, so the slower of
    the two bounds the collective.
    """
    n = np.asarray(group.size, dtype=float)
    g = np.asarray(group.local, dtype=float)
    up, out = scaleup_for(cluster, g), cluster.scaleout
    share = nbytes / np.maximum(n, 1)
    intra = (g - 1) * (up.latency_s + share / up.bus_bytes_per_s)
    inter = (n - g) * (out.latency_s + share / out.bus_bytes_per_s)
    return np.where(n > 1, np.maximum(intra, inter), 0.0)
