"""Parallel dimensions: one registry entry each.

A dimension knows the plan field giving its size, what its members split, whether they
hold the same weights (then they reduce gradients together and ZeRO shards the model
states over them), and which collective group it forms. Ranks are laid out innermost-first
in `plan.rank_order` (Megatron-LM's default tp-cp-dp-pp), which decides whether a group
stays inside a scale-up domain (comm.placement). Adding a dimension is adding an
entry here and the physics of what it splits. The expert dimensions (ep, etp) live in
Megatron-Core's second, expert rank layout over the same devices (expert_order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .comm import Placement, placement
from .hardware import Cluster


@dataclass(frozen=True)
class Dim:
    name: str
    plan_field: str
    splits: str  # what its members divide among themselves
    replicates_weights: bool  # members hold the same weights: gradient reduction and ZeRO group


DIMS: dict[str, Dim] = {d.name: d for d in (
    # Megatron-LM column/row-parallel matrices (Shoeybi et al. 2019); with sequence parallelism
    # also the sequence outside them (Korthikanti et al. 2022)
    Dim("tp", "tp", "the matrices of every layer (heads, FFN columns, vocabulary)", False),
    # ring attention over sequence chunks (Liu et al. 2023; Megatron-LM context parallelism)
    Dim("cp", "cp", "the sequence", True),
    Dim("dp", "dp", "the batch", True),
    Dim("pp", "pp", "the layers (pipeline stages)", False),
    # Mixture-of-Experts (moe.py): the routed experts of each MoE layer over EP ranks, each
    # expert's matrices over ETP ranks (Megatron-Core expert_model_parallel_size and
    # expert_tensor_parallel_size). They live in the expert layout (expert_sizes), carved
    # out of the tp x cp x dp devices of a pipeline stage.
    Dim("ep", "ep", "the routed experts of every MoE layer", False),
    Dim("etp", "etp", "the matrices of every routed expert", False),
)}


@dataclass(frozen=True)
class Groups:
    """The placed collective groups of a plan."""

    tp: Placement
    cp: Placement
    grad: Placement  # ZeRO's group: the ranks replicating the weights (dp x cp; one replica's under HSDP)
    pp: Placement
    # HSDP (plan.dp_replicate > 1): `grad` is one replica's dp/dp_replicate x cp ranks, and
    # this the dp_replicate replicas, which all-reduce their gradient shards
    replicate: Placement | None = None
    # hierarchical CP (cp_attention ulysses-ring): the all-to-all group of cp_ulysses
    # consecutive CP ranks, and the ring over the groups
    cp_a2a: Placement | None = None
    cp_ring: Placement | None = None
    # expert layout (expert_order): EP all-to-all, ETP gather, EP x ETP (all-gather dispatcher),
    # expert-DP (gradient reduction and ZeRO sharding of the expert parameters)
    ep: Placement | None = None
    etp: Placement | None = None
    ep_etp: Placement | None = None
    expert_grad: Placement | None = None
    expert_replicate: Placement | None = None  # HSDP's replicas in the expert layout

    @property
    def pp_crosses_domain(self):
        return self.pp.domains > 1

    @property
    def dp_crosses_domain(self) -> bool:
        """Some data-parallel collective leaves the scale-up domain (on every plan of a batch)."""
        crosses = np.asarray(self.grad.domains) > 1
        if self.replicate is not None:
            crosses = crosses | (np.asarray(self.replicate.domains) > 1)
        return bool(np.all(crosses))


def sizes(plan) -> dict:
    """Every dimension's size on this plan (numbers or numpy arrays)."""
    return {name: getattr(plan, d.plan_field) for name, d in DIMS.items()}


def expert_order(rank_order: str, folding: bool = True) -> str:
    """Megatron-Core's rank order of the expert layers for a dense rank order.

    Folding (Megatron-Core >= 0.10, NVIDIA/Megatron-LM@d98e8a64dd megatron/core/
    parallel_state.py initialize_model_parallel: the expert RankGenerator(tp=etp, ep=ep,
    dp=expert-DP, cp=1, order="tp-cp-ep-dp-pp")): ETP where TP is, EP then expert-DP where
    DP is, CP folded away; tp-cp-dp-pp gives etp-ep-edp-pp. Without (core_v0.9.0 @1afee592,
    one RankGenerator(tp, ep, dp, pp, cp, order="tp-cp-ep-dp-pp")): EP carved out of DP
    inside the dense layout, ETP = TP; tp-cp-dp-pp gives etp-cp-ep-edp-pp."""
    parts = {"tp": ("etp",), "cp": () if folding else ("cp",), "dp": ("ep", "edp"), "pp": ("pp",)}
    return "-".join(d for name in rank_order.split("-") for d in parts[name])


def expert_sizes(plan) -> dict:
    """Sizes in the expert layout (expert_order). Folded: etp, ep, the expert data-parallel
    degree edp and pp; without folding cp stays and edp = dp/ep (the expert gradients then
    reduce over the dp/ep x cp ranks: the same devices / (pp·ep·etp) replicas)."""
    if plan.moe.folding:
        return {"etp": plan.etp, "ep": plan.ep, "edp": expert_grad_group_size(plan), "pp": plan.pp}
    return {"etp": plan.etp, "cp": plan.cp, "ep": plan.ep, "edp": plan.dp // plan.ep, "pp": plan.pp}


def grad_dims() -> tuple[str, ...]:
    return tuple(name for name, d in DIMS.items() if d.replicates_weights)


def groups(plan, cluster: Cluster) -> Groups:
    """Placement of each group under the plan's rank order on the cluster's scale-up domains.

    Under hybrid sharding the dp dimension splits into a replica's consecutive ranks inside
    ("dp", dp/dp_replicate of them) and the replicas outside ("dpr"): torchtitan's device mesh
    is (pp, dp_replicate, dp_shard, cp, tp), outermost first, and FSDP2 gets (dp_replicate,
    dp_shard x cp) (torchtitan@9dec370 torchtitan/parallelisms/parallel_dims.py build_mesh,
    parallelize_llama.py); Megatron-LM's distributed-optimizer instances are consecutive
    slices of a dp-cp group's ranks, the inter-instance groups strided across them
    (megatron/core/parallel_state.py initialize_model_parallel, num_distributed_optimizer_instances)."""
    s = sizes(plan)
    order, domain = plan.rank_order, cluster.scaleup_domain
    hybrid = np.any(np.asarray(plan.dp_replicate) > 1)
    if hybrid:
        s, order = _split(s, order, "dp", "dp", s["dp"] // plan.dp_replicate, "dpr")
    e, e_order = expert_sizes(plan), expert_order(plan.rank_order, plan.moe.folding)
    expert_grad = ("edp",) if plan.moe.folding else ("cp", "edp")
    if hybrid:  # Megatron-Core's expert grid (tp, ep, inner_dp, outer_dp, pp), innermost first
        e, e_order = _split(e, e_order, "edp", "edp", e["edp"] // plan.dp_replicate, "edpr")
    # hierarchical CP: TE's ring sends to the rank cp_ulysses further on (TE@d0067d0da
    # context_parallel.py AttnFuncWithCPAndKVP2P: send_dst = cp_global_ranks[(rank + 1) %
    # cp_size * cp_size_a2a + rank_a2a])
    hierarchical = np.any(np.asarray(plan.cp_ulysses) > 1)
    cs, c_order = _split(s, order, "cp", "cpa", plan.cp_ulysses, "cp") if hierarchical else (s, order)
    return Groups(tp=placement(s, "tp", order, domain), cp=placement(s, "cp", order, domain),
                  grad=placement(s, grad_dims(), order, domain), pp=placement(s, "pp", order, domain),
                  replicate=placement(s, "dpr", order, domain) if hybrid else None,
                  cp_a2a=placement(cs, "cpa", c_order, domain) if hierarchical else None,
                  cp_ring=placement(cs, "cp", c_order, domain) if hierarchical else None,
                  ep=placement(e, "ep", e_order, domain), etp=placement(e, "etp", e_order, domain),
                  ep_etp=placement(e, ("etp", "ep"), e_order, domain),
                  expert_grad=placement(e, expert_grad, e_order, domain),
                  expert_replicate=placement(e, "edpr", e_order, domain) if hybrid else None)


def _split(s: dict, order: str, dim: str, inner: str, inner_size, outer: str) -> tuple[dict, str]:
    """Sizes and rank order with `dim` split into `inner` (inner_size consecutive ranks) and
    `outer` (the rest, strided over them)."""
    return {**s, outer: s[dim] // inner_size, inner: inner_size}, order.replace(dim, f"{inner}-{outer}")


def expert_grad_group_size(plan):
    """Ranks holding the same expert weights (expert-DP, devices / (pp·ep·etp)): ZeRO shards
    the expert parameters' states over them (Megatron-Core's expert data-parallel group)."""
    return plan.tp * plan.cp * plan.dp // (plan.ep * plan.etp)


def expert_zero_group_size(plan):
    """Ranks over which ZeRO shards the expert parameters' states: the expert-DP group, or
    one replica's share of it under hybrid sharding."""
    return expert_grad_group_size(plan) // plan.dp_replicate


def grad_group_size(plan):
    """Ranks holding the same weights (dp x cp), whose gradients are reduced together."""
    out = 1
    for name in grad_dims():
        out = out * getattr(plan, DIMS[name].plan_field)
    return out


def zero_group_size(plan):
    """Ranks over which ZeRO shards the model states: those holding the same weights, or
    under hybrid sharding one replica's of them (dp/dp_replicate x cp)."""
    return grad_group_size(plan) // plan.dp_replicate
