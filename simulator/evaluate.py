"""evaluate(scenario) -> Result: memory, step time, throughput and cost of one plan.

The scenario is compiled once into a Layout (layout.py); one of two engines reads it:
`graph` (default) executes the task graph of one step (graph.py, engine.py) and reports
its critical-path breakdown and the memory timeline's peaks; `analytic` composes the
Layout's costs in closed form (analytic.py), the fast path for sweeps.
"""

from __future__ import annotations

from dataclasses import replace

from . import analytic
from .energy import capped_cluster
from .errors import InputError
from .intervals import interval_fields
from .layout import Layout, compile_layout
from .memory import MEMORY_KEYS, StageMemory
from .result import Result, require_finite
from .scenario import Scenario
from .wholerun import run_economics, with_data_stall

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


def compile_scenario(scenario: Scenario) -> Layout:
    """The Layout of a scenario, on the clock its power cap leaves (energy.capped_cluster)."""
    return compile_layout(scenario.model, capped_cluster(scenario.cluster, scenario.training.power), scenario.plan)


def evaluate(scenario: Scenario, engine: str = "graph") -> Result:
    """Predict one training step of `scenario`. A plan that does not fit is feasible=False with a reason."""
    if engine not in ENGINES:
        raise InputError("engine", engine, "graph or analytic")
    if not isinstance(scenario, Scenario):
        raise InputError("scenario", type(scenario).__name__, "expected a Scenario (load_scenario, scenario_from_dict)")
    layout = compile_scenario(scenario)
    stages = analytic.memory_by_stage(layout)
    extra = {}
    if engine == "graph":
        from .engine import simulate

        sim = simulate(layout)
        stages = [replace(s, activations=float(a)) for s, a in zip(stages, sim.activation_peak_bytes)]
        breakdown = dict(sim.breakdown_s)
        extra = {"simulated_tasks": sim.simulated_tasks, "graph_tasks": sim.graph_tasks,
                 "steady_state_extrapolated": sim.extrapolated,
                 "diagnostics": {"simulation_s": sim.simulation_s}}  # wall clock: not a result
    else:
        breakdown = {k: float(v) for k, v in analytic.step_breakdown(layout).items()}
    return assemble(scenario, layout, engine, breakdown, stages, extra)


def assemble(scenario: Scenario, layout: Layout, engine: str, breakdown: dict, stages: list[StageMemory],
             extra: dict) -> Result:
    """The Result of a scalar plan from an engine's breakdown and per-stage memory."""
    cluster, plan = scenario.cluster, scenario.plan
    stages = [StageMemory(i, *(float(getattr(s, k)) for k in (*MEMORY_KEYS, "cached_free_bytes")))
              for i, s in enumerate(stages)]
    peak = max(stages, key=lambda s: s.total)
    capacity = cluster.accelerator.hbm_bytes
    feasible = peak.total <= capacity
    reason = "" if feasible else oom_reason(peak.stage, peak.as_dict(), peak.total, capacity, cluster.accelerator.name)
    host = float(analytic.host_bytes_per_device(layout))
    if feasible and host * cluster.devices_per_node > cluster.node.host_memory_bytes:
        feasible = False
        reason = host_reason(host, cluster.devices_per_node, cluster.node.host_memory_bytes, cluster.node.name)
    breakdown, data = with_data_stall(layout, scenario.training, breakdown)
    step = sum(breakdown.values())
    require_finite({"step_time_s": step, **breakdown, "peak_memory_bytes": peak.total}, "evaluate")
    econ, run = run_economics(layout, scenario.training, breakdown, data, step, cluster.devices,
                              scenario.price_usd_per_device_hour)
    extra = {**extra, **interval_fields(step, plan.global_batch * scenario.model.seq_len, cluster.accelerator,
                                        engine, scenario=scenario)}
    return Result(
        scenario=scenario.name, engine=engine, feasible=feasible, reason=reason, step_time_s=step,
        breakdown_s=breakdown, global_batch=plan.global_batch, seq_len=scenario.model.seq_len,
        devices=cluster.devices, model_flops_per_step=float(layout.model_flops_per_step),
        hardware_flops_per_step=float(layout.hardware_flops_per_step),
        peak_flops_per_device=cluster.accelerator.peak(plan.precision), peak_memory_bytes=peak.total,
        peak_memory_stage=peak.stage, peak_reserved_bytes=max(s.reserved_bytes for s in stages),
        memory_bytes=peak.as_dict(), memory_by_stage=[s.as_dict() for s in stages],
        capacity_bytes=capacity, host_bytes_per_device=host,
        economics=econ, extra=extra, whole_run=run,
        parameters=float(scenario.model.params()), active_parameters=float(scenario.model.active_params()))

