"""Economics of a step result: dollars per step and per token, time and cost to train.

Reads the step's numbers (step time, tokens, devices) and the price; converts nothing but
what it computes. With the run's goodput (goodput.py) and energy (energy.py), time and
cost to train include failures, checkpoints and restarts, and the electricity bill; the
step-only figures stay (`*_no_failures`). Broadcast-safe (arrays of plans).
"""

from __future__ import annotations

from dataclasses import dataclass

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Economics:
    price_usd_per_device_hour: object
    cost_usd_per_step: object  # device-hours of one step at the price (no energy)
    usd_per_million_tokens: object
    training_tokens: object  # None when the scenario gives no token budget
    time_to_train_s: object  # None without a token budget; with failures when goodput is given
    cost_to_train_usd: object  # device-hours of that time, plus energy when given
    time_to_train_s_no_failures: object = None
    cost_to_train_usd_no_failures: object = None  # device-hours of the step-only time
    interruptions: object = None  # expected over the run
    lost_time_s: object = None  # wall time not spent on useful steps
    energy_kwh_to_train: object = None
    energy_cost_to_train_usd: object = None


def economics(step_time_s, tokens_per_step, devices, price_usd_per_device_hour, training_tokens=None,
              goodput=None, energy=None) -> Economics:
    """Cost of a step at the price per device-hour; time and cost of `training_tokens` tokens
    at this step's throughput, with the run's failures (`goodput`, a goodput.Goodput) and
    energy (`energy`, an energy.Energy: steps and re-run work at the stepping power,
    checkpoint stalls and restarts at the standing power, times its price per kWh)."""
    cost_per_step = step_time_s * devices * price_usd_per_device_hour / SECONDS_PER_HOUR
    usd_per_token = cost_per_step / tokens_per_step
    out = dict(price_usd_per_device_hour=price_usd_per_device_hour, cost_usd_per_step=cost_per_step,
               usd_per_million_tokens=usd_per_token * 1e6, training_tokens=training_tokens, time_to_train_s=None,
               cost_to_train_usd=None)
    if training_tokens:
        useful = training_tokens / tokens_per_step * step_time_s
        device_hours_usd = devices * price_usd_per_device_hour / SECONDS_PER_HOUR
        out.update(time_to_train_s=useful, cost_to_train_usd=training_tokens * usd_per_token,
                   time_to_train_s_no_failures=useful, cost_to_train_usd_no_failures=training_tokens * usd_per_token)
        wall, rework, idle = useful, 0.0 * useful, 0.0 * useful
        if goodput is not None:
            wall, rework, idle, interruptions = goodput.parts(useful)
            out.update(time_to_train_s=wall, cost_to_train_usd=wall * device_hours_usd, interruptions=interruptions,
                       lost_time_s=wall - useful)
        if energy is not None:
            kwh = energy.kwh(useful + rework, idle)
            out.update(energy_kwh_to_train=kwh, energy_cost_to_train_usd=kwh * energy.usd_per_kwh,
                       cost_to_train_usd=wall * device_hours_usd + kwh * energy.usd_per_kwh)
    return Economics(**out)
