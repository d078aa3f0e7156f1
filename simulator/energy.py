"""Power and energy of a training run, and the clock a power cap leaves.

- A device draws P = P_idle + (P_busy - P_idle)·u, u the fraction of the step it runs kernels
  (all but the pipeline bubble and the wait for data): the linear utilisation model of Fan,
  Weber and Barroso (2007, "Power provisioning for a warehouse-sized computer", ISCA).
  P_busy is the TDP (or the cap): training GEMMs keep a GPU at its power limit (an 8x H100
  node training Llama2-13b drew 8.4 kW, Latif et al. 2024, arXiv 2412.08602, which the node
  profiles' overhead is taken from). P_idle: the profile's `idle_power_w`, else 12 % of the
  TDP (the median idle/TDP ratio of the profiles that measure it: 68/700, 78/700, 65/400,
  55/400).
- A node adds `power_overhead_w` (CPUs, memory, NICs, fans, power conversion) all the time;
  without it in the profile, half the node's accelerator TDP (the DGX H100 measurement:
  2.8 kW next to 8 x 700 W).
- The facility multiplies by its PUE (default 1.1: Google's fleet-wide PUE, 2021; the
  Uptime Institute's 2021 survey average is 1.57, via CNBC 2022-04-13).
- A power cap below the busy power lowers the sustained clock, and with it the peak FLOP/s
  (memory bandwidth unchanged: HBM has its own clock). Dynamic power ∝ C·V²·f and under
  DVFS V scales with f, so P - P_idle ∝ f³ (Hennessy & Patterson, Computer Architecture,
  Sec. 1.5): f/f_max = ((cap - P_idle)/(P_busy - P_idle))^(1/3).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .bcast import maximum, minimum
from .errors import InputError
from .training import Power

DEFAULT_IDLE_FRACTION = 0.12
DEFAULT_NODE_OVERHEAD_FRACTION = 0.5
JOULES_PER_KWH = 3.6e6


def idle_w(acc, power: Power) -> float:
    if power.idle_w is not None:
        return power.idle_w
    return acc.idle_w if acc.idle_w is not None else DEFAULT_IDLE_FRACTION * acc.tdp_w


def busy_w(acc, power: Power) -> float:
    return acc.tdp_w if power.cap_w is None else min(acc.tdp_w, power.cap_w)


def node_overhead_w(cluster, power: Power) -> float:
    if power.node_overhead_w is not None:
        return power.node_overhead_w
    if cluster.node.power_overhead_w is not None:
        return cluster.node.power_overhead_w
    return DEFAULT_NODE_OVERHEAD_FRACTION * cluster.devices_per_node * cluster.accelerator.tdp_w


def clock_ratio(cap_w, idle, tdp) -> float:
    """Sustained clock under a cap, as a fraction of the uncapped one (module docstring)."""
    return min(1.0, ((cap_w - idle) / (tdp - idle)) ** (1.0 / 3.0))


def capped_cluster(cluster, power: Power):
    """The cluster whose accelerator peaks at the capped clock (the same object without a cap)."""
    if power.cap_w is None or power.cap_w >= cluster.accelerator.tdp_w:
        return cluster
    acc = cluster.accelerator
    idle = idle_w(acc, power)
    if power.cap_w <= idle:
        raise InputError("training.power.cap_w", power.cap_w, f"must exceed the idle power of {acc.name} "
                         f"({idle:g} W)")
    ratio = clock_ratio(power.cap_w, idle, acc.tdp_w)
    return replace(cluster, accelerator=replace(acc, peak_flops={k: v * ratio for k, v in acc.peak_flops.items()}))


def device_power_w(idle, busy, busy_fraction):
    """Average power of a device busy for `busy_fraction` of the time (linear model)."""
    return idle + (busy - idle) * busy_fraction


@dataclass(frozen=True)
class Energy:
    step_power_w: object  # facility power while stepping (devices, node overhead, PUE)
    idle_power_w: object  # facility power while the job stands (checkpoint stalls, restarts)
    kwh_per_step: object
    usd_per_kwh: float

    def kwh(self, stepping_s, idle_s):
        return (stepping_s * self.step_power_w + idle_s * self.idle_power_w) / JOULES_PER_KWH


def energy(cluster, power: Power, step_s, breakdown: dict) -> Energy:
    """Facility power and energy per step; `breakdown` says which part of the step idles."""
    acc = cluster.accelerator
    idle, busy = idle_w(acc, power), busy_w(acc, power)
    waiting = breakdown.get("pipeline_bubble", 0.0) + breakdown.get("data", 0.0)
    u = maximum(0.0, minimum(1.0, 1.0 - waiting / step_s))
    overhead = cluster.nodes * node_overhead_w(cluster, power)
    stepping = power.pue * (cluster.devices * device_power_w(idle, busy, u) + overhead)
    standing = power.pue * (cluster.devices * idle + overhead)
    return Energy(stepping, standing, step_s * stepping / JOULES_PER_KWH, power.energy_usd_per_kwh)
