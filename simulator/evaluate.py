"""evaluate(scenario) -> Result: memory, step time, throughput and cost of one plan.

Two engines: `graph` (default) executes the task graph of one step (graph.py, engine.py)
and reports its critical-path breakdown and the memory timeline's peak; `analytic`
composes the per-stage costs in closed form (analytic.py), the fast path for sweeps.
"""

from __future__ import annotations

from dataclasses import replace

from .analytic import step_breakdown
from .errors import InputError
from .intervals import interval_fields
from .memory import host_bytes_per_device, memory_by_stage
from .result import Result
from .scenario import Scenario
from .workload import model_flops_per_sequence, recompute_flops_per_sequence

GIB = 2**30
ENGINES = ("graph", "analytic")


def oom_reason(stage: int, parts: dict, total: float, capacity: float, accelerator: str) -> str:
    """The reason of an out-of-memory result."""
    shown = ", ".join(f"{k} {v / GIB:.1f}" for k, v in parts.items())
    return (f"out of memory: pipeline stage {stage} needs {total / GIB:.1f} GiB "
            f"({shown}) > {capacity / GIB:.1f} GiB on {accelerator}")


def host_reason(per_device: float, devices_per_node: int, capacity: float, node: str) -> str:
    """The reason of a result whose offloaded state does not fit in the hosts' memory."""
    need = per_device * devices_per_node
    return (f"out of host memory: offload needs {need / GIB:.1f} GiB per node ({devices_per_node} devices x "
            f"{per_device / GIB:.1f}) > {capacity / GIB:.1f} GiB on {node}")


def evaluate(scenario: Scenario, engine: str = "graph") -> Result:
    """Predict one training step of `scenario`. An out-of-memory plan is feasible=False with a reason."""
    if engine not in ENGINES:
        raise InputError("engine", engine, "graph or analytic")
    model, plan, cluster = scenario.model, scenario.plan, scenario.cluster
    stages = memory_by_stage(model, plan, cluster)
    extra = {}
    if engine == "graph":
        from .engine import simulate

        sim = simulate(scenario)
        stages = [replace(s, activations=float(a)) for s, a in zip(stages, sim.activation_peak_bytes)]
        extra = {"simulated_tasks": sim.simulated_tasks, "graph_tasks": sim.graph_tasks,
                 "simulation_s": sim.simulation_s, "steady_state_extrapolated": sim.extrapolated}
    peak = max(stages, key=lambda s: s.total)
    capacity = cluster.accelerator.hbm_bytes
    feasible = peak.total <= capacity
    reason = "" if feasible else oom_reason(peak.stage, peak.as_dict(), peak.total, capacity, cluster.accelerator.name)
    host = float(host_bytes_per_device(model, plan))
    if feasible and host * cluster.devices_per_node > cluster.node.host_memory_bytes:
        feasible = False
        reason = host_reason(host, cluster.devices_per_node, cluster.node.host_memory_bytes, cluster.node.name)
    if engine == "graph":
        breakdown = dict(sim.breakdown_s)
    else:
        breakdown = step_breakdown(model, plan, cluster)
    step = sum(breakdown.values())
    seqs = plan.global_batch
    # [issue 10] prediction interval from the validation residuals that apply to this profile
    extra.update(interval_fields(step, seqs * model.seq_len, cluster.accelerator, engine))
    model_flops = model_flops_per_sequence(model) * seqs
    hw_flops = model_flops + recompute_flops_per_sequence(model, plan.recompute, plan.flash_attention) * seqs
    return Result(
        scenario=scenario.name, feasible=feasible, reason=reason, step_time_s=step,
        global_batch=plan.global_batch, seq_len=model.seq_len, devices=cluster.devices,
        model_flops_per_step=model_flops, hardware_flops_per_step=hw_flops,
        peak_flops_per_device=cluster.accelerator.peak(plan.precision),
        peak_memory_bytes=peak.total, peak_memory_stage=peak.stage, memory_bytes=peak.as_dict(),
        memory_by_stage=[s.as_dict() for s in stages], capacity_bytes=capacity, breakdown_s=breakdown,
        price_usd_per_device_hour=scenario.price_usd_per_device_hour,
        training_tokens=scenario.training.tokens, engine=engine, extra=extra,
    )
