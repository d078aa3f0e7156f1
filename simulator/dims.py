"""Parallel dimensions: one registry entry each.

A dimension knows the plan field giving its size, what its members split, whether they
hold the same weights (then they reduce gradients together and ZeRO shards the model
states over them), and which collective group it forms. Ranks are laid out innermost-first
in `plan.rank_order` (Megatron-LM's default tp-cp-dp-pp), which decides whether a group
stays inside a scale-up domain (comm.placement). Adding a dimension (expert parallelism,
say) is adding an entry here and the physics of what it splits.
"""

from __future__ import annotations

from dataclasses import dataclass

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
)}


@dataclass(frozen=True)
class Groups:
    """The placed collective groups of a plan."""

    tp: Placement
    cp: Placement
    grad: Placement  # dimensions replicating the weights (dp x cp): gradient reduction, ZeRO sharding
    pp: Placement

    @property
    def pp_crosses_domain(self):
        return self.pp.domains > 1


def sizes(plan) -> dict:
    """Every dimension's size on this plan (numbers or numpy arrays)."""
    return {name: getattr(plan, d.plan_field) for name, d in DIMS.items()}


def grad_dims() -> tuple[str, ...]:
    return tuple(name for name, d in DIMS.items() if d.replicates_weights)


def groups(plan, cluster: Cluster) -> Groups:
    """Placement of each group under the plan's rank order on the cluster's scale-up domains."""
    s = sizes(plan)
    order, domain = plan.rank_order, cluster.scaleup_domain
    return Groups(tp=placement(s, "tp", order, domain), cp=placement(s, "cp", order, domain),
                  grad=placement(s, grad_dims(), order, domain), pp=placement(s, "pp", order, domain))


def grad_group_size(plan):
    """Ranks holding the same weights (dp x cp): ZeRO shards the model states over them."""
    out = 1
    for name in grad_dims():
        out = out * getattr(plan, DIMS[name].plan_field)
    return out
