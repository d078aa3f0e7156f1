"""Economics of a step result: dollars per step and per token, time and cost to train.

Reads the step's numbers (step time, tokens, devices) and the price; converts nothing but
what it computes. Broadcast-safe (arrays of plans).
"""

from __future__ import annotations

from dataclasses import dataclass

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Economics:
    price_usd_per_device_hour: object
    cost_usd_per_step: object
    usd_per_million_tokens: object
    training_tokens: object  # None when the scenario gives no token budget
    time_to_train_s: object  # None without a token budget
    cost_to_train_usd: object


def economics(step_time_s, tokens_per_step, devices, price_usd_per_device_hour, training_tokens=None) -> Economics:
    """Cost of a step at the price per device-hour; time and cost of `training_tokens`
    tokens at this step's throughput (no failures, restarts or data stalls)."""
    cost_per_step = step_time_s * devices * price_usd_per_device_hour / SECONDS_PER_HOUR
    usd_per_token = cost_per_step / tokens_per_step
    time_to_train = cost_to_train = None
    if training_tokens:
        time_to_train = training_tokens / tokens_per_step * step_time_s
        cost_to_train = training_tokens * usd_per_token
    return Economics(price_usd_per_device_hour, cost_per_step, usd_per_token * 1e6, training_tokens, time_to_train,
                     cost_to_train)
