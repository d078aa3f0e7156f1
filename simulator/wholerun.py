"""From a step to the whole run: the data stall added to an engine's step, then goodput,
energy and economics. The one place both evaluation paths (evaluate.assemble and
vector.evaluate_batch) go through; broadcast-safe.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import datapipe, energy as E, goodput as G
from .economics import Economics, economics
from .result import BREAKDOWN_KEYS
from .training import default_dataset, default_storage


@dataclass(frozen=True)
class WholeRun:
    data: datapipe.DataTime
    goodput: G.Goodput
    energy: E.Energy


def with_data_stall(layout, training, breakdown: dict) -> tuple[dict, datapipe.DataTime]:
    """The engine's breakdown plus `data`, the seconds per step the accelerators wait for input."""
    pipe = training.data
    tokens = layout.plan.global_batch * layout.model.seq_len
    data = datapipe.data_time(tokens, layout.model.seq_len, sum(breakdown.values()), pipe,
                              pipe.dataset or default_dataset(), pipe.storage or default_storage(), layout.cluster)
    merged = {**breakdown, "data": data.exposed_s}
    return {k: merged[k] for k in BREAKDOWN_KEYS}, data


def run_economics(layout, training, breakdown: dict, data: datapipe.DataTime, step_s, devices,
                  price) -> tuple[Economics, WholeRun]:
    """Goodput, energy and the economics of the run at `step_s` per step (data stall included)."""
    good = G.goodput(layout, training, training.checkpoint.storage or default_storage(), step_s)
    power = E.energy(layout.cluster, training.power, step_s, breakdown)
    tokens = layout.plan.global_batch * layout.model.seq_len
    return economics(step_s, tokens, devices, price, training.tokens, good, power), WholeRun(data, good, power)
