"""The DeepEP library's dispatch and combine kernels as Megatron-Core's flex token dispatcher runs
them: DeepEP's normal kernels (`plan.moe.dispatcher: deepep`; --moe-token-dispatcher-type flex
--moe-flex-dispatcher-backend deepep, or the deprecated --moe-enable-deepep) and NVIDIA's Hybrid-EP
(`hybridep`; --moe-flex-dispatcher-backend hybridep).

What Megatron-Core does (NVIDIA/Megatron-LM@d98e8a64dd megatron/core/transformer/moe/
token_dispatcher.py MoEFlexTokenDispatcher and _DeepepManager, fused_a2a.py): one group over the
expert-TP x EP ranks (n = etp·ep); each token goes, in BF16 (get_hidden_bytes: at least 2 B an
element), to every rank holding one of its top-k experts, and to all etp ranks of that expert's
EP rank (the routing map replicated over expert TP, _initialize_metadata), once per rank however
many of its experts the rank holds; the receiving rank permutes the rows it received into its
local experts' order; the combine sends each rank's sum over its experts back (its expert-TP
partial sums added on the way) and adds them. The backward pass runs the same kernels the other
way round (FusedDispatch.backward is a combine, FusedCombine.backward a dispatch).

What DeepEP does (deepseek-ai/DeepEP@dd758ca, V1 kernels kept as deep_ep/buffers/legacy.py,
csrc/legacy/, csrc/kernels/legacy/; docs/legacy.md): ranks form "NVL peers", 8 consecutive
ranks of one node joined by NVLink (LEGACY_NUM_MAX_NVL_PEERS); a group of more than 8 ranks is
8 ranks x n/8 "RDMA ranks". A token crosses the network once per destination node, to the GPU
of its own local index there, which forwards it over NVLink to the destination ranks of that
node; the RDMA and NVLink legs run pipelined in chunks, so the slower one sets the time. Its
published bottleneck bandwidths (docs/legacy.md, H800, DeepSeek-V3's shapes) are at the links'
rates: 153-158 GB/s of NVLink's ~160, 43-58 GB/s of the 50 GB/s NIC, the latter counting the
local rank's traffic.

What Hybrid-EP does (DeepEP@94a9f8f6 branch hybrid-ep: docs/README_Hybrid-EP.md,
docs/Hybrid-EP_Implementation.md, deep_ep/hybrid_ep_buffer.py, csrc/hybrid_ep/buffer/): the same
two legs, a token sent once per destination NVLink domain over RDMA and once per destination
rank inside it, where a "node" is the group's ranks in one NVLink domain, however many
(num_of_hybrid_ep_ranks_per_nvlink_domain: 8 in a DGX, up to 72 in an NVL72 rack); its
dispatch writes the rows permuted by local expert and padded to the quantization multiple
(Megatron-Core moe_utils.py skip_routed_expert_padding: the experts then pad nothing); its
buffers are allocated once, for the worst case of every token of the group routed to one rank
(hybrid_buffer_bytes).

Expected destinations. With routing taken uniform (balanced), a token picks router_group_topk of
router_groups expert groups and its top_k experts among theirs (model.router_groups;
DeepSeek-V3's node-limited routing; none: one group), and a unit holding `held` consecutive
experts (an EP rank's, a node's) is reached with probability hit_fraction. A rank sends per
token: over NVLink the destination ranks other than the receiving GPU, over RDMA the
destination nodes other than its own (expected counts, each times its own-share fraction).

The SMs the kernels take (plan.moe.dispatcher_sms, Megatron-Core's --moe-flex-dispatcher-num-sms;
by default DeepEP 20, Hybrid-EP 24 or 8) slow the compute a pass overlaps them with
(moe.exposed_dispatch_s). Checked against Hybrid-EP's published B200 and GB200 timings
(validation/ep_dispatch_bench.py): its kernels run 1-22 % slower than predicted. Not modelled:
the rate DeepEP's SMs cap on Blackwell's NVLink (there 55-61 % slower than predicted at 16 SMs,
17-25 % at 44-48); DeepEP V2 (NCCL Gin) and NCCL EP, which the importers refuse.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .comm import placement, scaleup_for
from .errors import InputError

BACKENDS = ("deepep", "hybridep")  # plan.moe.dispatcher values this module models
NVL_PEERS = 8  # LEGACY_NUM_MAX_NVL_PEERS (csrc/kernels/legacy/compiled.cuh)
DEEPEP_SMS = 20  # Megatron-Core's default (token_dispatcher.py _DeepepManager: set_deepep_num_sms(20))
# Hybrid-EP's defaults (csrc/hybrid_ep/config.cuh: num_sms_dispatch_api / combine_api), one
# NVLink domain or several
HYBRID_SMS_ONE_DOMAIN, HYBRID_SMS_ACROSS = 24, 8
# Buffer.get_dispatch_config / get_combine_config (deep_ep/buffers/legacy.py): group size ->
# (NVL chunk tokens sent, received, RDMA chunk tokens sent, received); only these sizes run
DISPATCH_CONFIGS = {2: (24, 256, 6, 128), 4: (6, 256, 6, 128), 8: (6, 256, 6, 128), 16: (36, 288, 20, 128),
                    24: (32, 288, 8, 128), 32: (32, 288, 8, 128), 48: (32, 288, 8, 128), 64: (32, 288, 8, 128),
                    96: (20, 480, 12, 128), 128: (20, 560, 12, 128), 144: (32, 720, 12, 128),
                    160: (28, 720, 12, 128)}
COMBINE_CONFIGS = {2: (10, 256, 6, 128), 4: (9, 256, 6, 128), 8: (4, 256, 6, 128), 16: (4, 288, 12, 128),
                   24: (1, 288, 8, 128), 32: (1, 288, 8, 128), 48: (1, 288, 8, 128), 64: (1, 288, 8, 128),
                   96: (1, 480, 8, 128), 128: (1, 560, 8, 128), 144: (2, 720, 8, 128), 160: (2, 720, 8, 128)}
GROUP_SIZES = tuple(DISPATCH_CONFIGS)
MAX_TOPK = MAX_SCALES = 128  # kNumMaxTopK, kNumMaxScales (csrc/legacy/config.hpp)
SOURCE_META_BYTES = 8  # internode SourceMeta: two ints
TOPK_INDEX_BYTES = 8  # deep_ep.topk_idx_t, int64


def _comb(n, r):
    """Binomial coefficient C(n, r) as a float (0 outside 0 <= r <= n), broadcast-safe."""
    from scipy.special import gammaln

    n, r = np.asarray(n, dtype=float), np.asarray(r, dtype=float)
    ok = (r >= 0) & (r <= n)
    n_, r_ = np.where(ok, n, 1.0), np.where(ok, r, 0.0)
    return np.where(ok, np.exp(gammaln(n_ + 1) - gammaln(r_ + 1) - gammaln(n_ - r_ + 1)), 0.0)


def hit_fraction(model, held):
    """Probability that a token's top_k routed experts include one of `held` consecutive
    experts, routing uniform: router_group_topk of router_groups groups chosen, then top_k
    experts among their experts (Megatron-Core router.py group_limited_topk). `held` lies
    inside one group or is whole groups (check_plan). Without groups:
    1 - C(E - held, k) / C(E, k)."""
    groups, chosen = (model.router_groups, model.router_group_topk) if model.router_groups else (1, 1)
    if np.ndim(held) == 0:  # one plan: the same few numbers every evaluation
        return _hit_fraction(model.experts, model.top_k, groups, chosen, float(held))
    return _hit_fractions(model.experts, model.top_k, groups, chosen, held)


@lru_cache(maxsize=1024)
def _hit_fraction(e, k, groups, chosen, held) -> float:
    return float(_hit_fractions(e, k, groups, chosen, held))


def _hit_fractions(e, k, groups, chosen, held):
    per_group = e / groups
    pool = chosen * per_group  # experts a token's top_k are drawn from
    held = np.asarray(held, dtype=float)
    none_in = _comb(pool - held, k) / _comb(pool, k)
    inside = 1.0 - chosen / groups * (1.0 - none_in)  # P(missed) for a part of one group
    whole = np.maximum(held / per_group, 1.0)  # groups held
    missed = sum(_comb(whole, i) * _comb(groups - whole, chosen - i) / _comb(groups, chosen)
                 * _comb(pool - i * per_group, k) / _comb(pool, k) for i in range(chosen + 1))
    return 1.0 - np.where(held <= per_group, inside, missed)


def layout_nodes(experts, groups):
    """(ranks n, ranks a node p, nodes n/p): DeepEP's nodes are 8 NVLink peers, Hybrid-EP's the
    group's ranks in one scale-up domain."""
    n = np.asarray(experts.ep) * np.asarray(experts.etp)
    p = np.asarray(groups.ep_etp.local) if experts.options.dispatcher == "hybridep" else np.minimum(n, NVL_PEERS)
    return n, p, n / p


def layout(model, experts, groups):
    """layout_nodes and the destination ranks and destination nodes a token has."""
    n, p, nodes = layout_nodes(experts, groups)
    ranks = n * hit_fraction(model, model.experts / np.asarray(experts.ep))
    return n, p, nodes, ranks, nodes * hit_fraction(model, node_experts(model, experts.ep, nodes))


def node_experts(model, ep, nodes):
    """Experts a node's ranks hold: a share of the EP ranks, or one EP rank's whose expert-TP
    ranks span several nodes."""
    return np.maximum(model.experts / np.asarray(nodes), model.experts / np.asarray(ep))


def comm_s(model, shard, experts, groups, cluster):
    """Seconds of one MoE layer's dispatch and combine per pass on the busiest rank: each way
    the NVLink leg (destination ranks the receiving GPU forwards to, or this rank sends to in its
    own node: ranks·(p-1)/p a token) and the RDMA leg (destination nodes but its own:
    nodes_hit·(N-1)/N), pipelined, whichever is slower; a token's row is its hidden state in the
    activation dtype."""
    n, p, nodes, ranks, nodes_hit = layout(model, experts, groups)
    row = shard.act_bytes * model.hidden * experts.options.busiest_rows * shard.replicated_tokens
    up = scaleup_for(cluster, p)
    nvl = row * ranks * (p - 1) / p / up.bus_bytes_per_s + up.latency_s
    out = cluster.scaleout
    rdma = np.where(nodes > 1, row * nodes_hit * (nodes - 1) / nodes / out.bus_bytes_per_s + out.latency_s, 0.0)
    return np.where(n > 1, 2 * np.maximum(nvl, rdma), 0.0)


def dispatch_bytes(model, shard, experts, groups):
    """Bytes a device holds for the dispatch beside one layer's permuted rows: DeepEP's received
    tokens (a tensor per layer: its share of every rank's destinations) and its buffer, or
    Hybrid-EP's buffers (it receives into them)."""
    if experts.options.dispatcher == "hybridep":
        return hybrid_buffer_bytes(model, shard, experts, groups)
    _, _, _, ranks, _ = layout(model, experts, groups)
    received = experts.options.busiest_rows * shard.replicated_tokens * ranks
    return shard.act_bytes * model.hidden * received + buffer_bytes(model, experts, shard.act_bytes)


def hybrid_buffer_bytes(model, shard, experts, groups):
    """Hybrid-EP's buffers for T tokens a rank, p ranks a node, N nodes, e = E/ep experts a rank
    (csrc/hybrid_ep/buffer/intranode.cu and internode_doca.cu, BF16 tokens): one intra-node
    buffer shared by dispatch and combine (use_shared_buffer) for T·p·N tokens, each its hidden
    row, e·p fp32 probabilities and h/128 fp32 scaling factors; across nodes the dispatch's input
    (T rows, e·p·N probabilities) and per remote node T rows each way with their probabilities."""
    _, p, nodes = layout_nodes(experts, groups)
    t, h, e = shard.replicated_tokens, model.hidden, model.experts / np.asarray(experts.ep)
    row, prob, scale = 2 * h, 4 * e * p, 4 * h / 128
    intra = t * p * nodes * (row + prob + scale)
    remote = nodes - 1
    rdma = t * (row + prob * nodes + scale) + t * remote * (row + prob + scale) + 2 * t * remote * (row + prob)
    return intra + np.where(nodes > 1, rdma, 0.0)


def _config_value(tables, n, index, align=False):
    """A column of DeepEP's config tables at group sizes n (0 where DeepEP has no config), the
    larger of dispatch and combine; with `align` the RDMA receive chunk rounded up to a multiple
    of the send chunk (Config)."""
    def value(cfg):
        send, recv = cfg[index - 1], cfg[index]
        return -(-recv // send) * send if align else recv
    if np.ndim(n) == 0:
        return float(max(value(t[int(n)]) for t in tables)) if int(n) in tables[0] else 0.0
    n = np.asarray(n)
    out = np.zeros(n.shape)
    for size in GROUP_SIZES:
        out = np.where(n == size, max(value(t[size]) for t in tables), out)
    return out


def dispatcher_sms(options, nodes):
    """SMs the dispatch and combine kernels take: plan.moe.dispatcher_sms, else the backend's
    default (DeepEP 20 as Megatron-Core sets it; Hybrid-EP 24 in one NVLink domain, 8 across)."""
    if options.dispatcher_sms:
        return options.dispatcher_sms
    if options.dispatcher == "hybridep":
        return np.where(np.asarray(nodes) > 1, HYBRID_SMS_ACROSS, HYBRID_SMS_ONE_DOMAIN)
    return DEEPEP_SMS


def sm_share(experts, groups, accelerator):
    """The share of the accelerator's SMs the kernels take while a pass overlaps them; none for
    the other dispatchers (NCCL's SMs are not counted, moe.exposed_dispatch_s)."""
    if experts.options.dispatcher not in BACKENDS:
        return 0.0
    _, _, nodes = layout_nodes(experts, groups)
    return dispatcher_sms(experts.options, nodes) / accelerator.sm_count


def buffer_bytes(model, experts, act_bytes):
    """DeepEP's communication buffer, allocated once (Megatron-Core fused_a2a.py get_buffer: the
    larger of the dispatch and combine configs' size hints, csrc/legacy/config.hpp
    get_nvl_buffer_size_hint and get_rdma_buffer_size_hint): per channel (half the SMs) and peer, the
    received chunk's rows of hidden bytes, source metadata, 128 top-k indices, weights and scales."""
    channels = dispatcher_sms(experts.options, 1) // 2
    n = np.asarray(experts.ep) * np.asarray(experts.etp)
    tables = (DISPATCH_CONFIGS, COMBINE_CONFIGS)
    hidden = model.hidden * max(act_bytes, 2)  # fused_a2a.py get_hidden_bytes
    nvl, rdma = np.minimum(n, NVL_PEERS), np.maximum(n // NVL_PEERS, 1)
    per_row = SOURCE_META_BYTES + MAX_TOPK * (TOPK_INDEX_BYTES + 4) + MAX_SCALES * 4
    nvl_bytes = channels * nvl * ((2 * rdma + 3) * 4 + _config_value(tables, n, 1) * (hidden + per_row))
    rows = _config_value(tables, n, 3, align=True)
    rdma_bytes = channels * rdma * ((NVL_PEERS * 2 + 2) * 2 * 4 + rows * 2 * (hidden + per_row + 16))
    return np.where(np.isin(n, GROUP_SIZES), nvl_bytes + np.where(n > NVL_PEERS, rdma_bytes, 0.0), 0.0)


def check_plan(plan, model, cluster) -> None:
    """Refuse a plan the backend cannot run: DeepEP's group sizes, its 8 NVLink peers in one
    node, Megatron-Core's own refusals (transformer_config.py: no padding to capacity with
    DeepEP), Hybrid-EP's equal ranks in every NVLink domain (hybrid_ep_buffer.py), and expert
    layouts hit_fraction does not cover."""
    from .dims import expert_order, expert_sizes
    n = plan.ep * plan.etp
    field = "plan.moe.dispatcher"
    acc = cluster.accelerator
    if not acc.sm_count:
        raise InputError(field, plan.moe.dispatcher, f"DeepEP's and Hybrid-EP's kernels run on NVIDIA GPUs, whose "
                         f"profiles give sm_count; {acc.name}'s profile has none")
    sms = plan.moe.dispatcher_sms
    if sms is not None and (sms > acc.sm_count or (plan.moe.dispatcher == "deepep" and sms % 2)):
        raise InputError("plan.moe.dispatcher_sms", sms, f"at most the {acc.sm_count} SMs of {acc.name}"
                         + (", and even (DeepEP runs a channel on two SMs)" if plan.moe.dispatcher == "deepep" else ""))
    order = expert_order(plan.rank_order, plan.moe.folding)
    if plan.moe.dispatcher == "hybridep":
        domain = placement(expert_sizes(plan), ("etp", "ep"), order, cluster.scaleup_domain)
        if n % int(domain.local):
            raise InputError(field, "hybridep", f"Hybrid-EP needs the same number of the ep*etp = {n} ranks in "
                             f"every NVLink domain; this plan places {int(domain.local)} in one")
        _check_groups(plan, model, float(n / domain.local))
        return
    if n not in GROUP_SIZES:
        raise InputError(field, "deepep", f"DeepEP's kernels run on groups of {', '.join(map(str, GROUP_SIZES))} "
                         f"ranks (deep_ep Buffer.get_dispatch_config); ep*etp = {n}")
    if plan.moe.pad_to_capacity:
        raise InputError("plan.moe.pad_to_capacity", True, "not with the deepep dispatcher (Megatron-Core refuses "
                         "moe_pad_expert_input_to_capacity with DeepEP)")
    node = placement(expert_sizes(plan), ("etp", "ep"), order, cluster.devices_per_node)
    peers = min(n, NVL_PEERS)
    if node.local < peers or (n > NVL_PEERS and node.local % NVL_PEERS):
        raise InputError(field, "deepep", f"DeepEP joins each {peers} consecutive ranks of its ep*etp = {n} group "
                         f"by NVLink inside one node; this plan places {int(node.local)} of them in a node of "
                         f"{cluster.devices_per_node} devices (multi-node NVLink: the hybridep dispatcher)")
    _check_groups(plan, model, n / peers)


def _check_groups(plan, model, nodes) -> None:
    per_group = model.experts // (model.router_groups or 1)
    for held in (model.experts / plan.ep, float(node_experts(model, plan.ep, nodes))):
        if held != int(held) or (held % per_group and per_group % held):
            raise InputError("plan.ep", plan.ep, f"with the {plan.moe.dispatcher} dispatcher an EP rank's and a "
                             f"node's experts ({held:g}) must divide or be whole router groups of {per_group} "
                             "experts")
