"""Energy of a step and of a run, and the clock a power cap leaves, worked by hand."""

import pytest

from simulator import InputError, evaluate, load_scenario
from simulator.energy import clock_ratio, energy
from simulator.hardware import Cluster, load_accelerator, load_network, load_node
from simulator.training import Power


def dgx_h100(nodes=1):
    node = load_node("dgx-h100")
    return Cluster(load_accelerator(node.accelerator), node, load_network(node.network), nodes, 8)


def test_energy_of_a_step():
    # 2 s step, 0.5 s of it pipeline bubble: busy 75 %. H100: idle 68 W, TDP 700 W ->
    # 68 + 632 x 0.75 = 542 W per GPU; node 8 x 542 + 2800 W = 7136 W; PUE 1.1 -> 7849.6 W
    e = energy(dgx_h100(), Power(), 2.0, {"compute": 1.5, "pipeline_bubble": 0.5})
    assert e.step_power_w == pytest.approx(7849.6)
    assert e.kwh_per_step == pytest.approx(2 * 7849.6 / 3.6e6)  # 0.00436 kWh
    assert e.idle_power_w == pytest.approx(1.1 * (8 * 68 + 2800))


def test_evaluate_charges_the_step_at_its_busy_fraction():
    s = load_scenario("scenarios/quickstart.yaml")
    d = evaluate(s, "analytic").to_dict()
    b = d["breakdown_s"]
    u = 1 - (b["pipeline_bubble"] + b["data"]) / d["step_time_s"]
    watts = 1.1 * (64 * (68 + 632 * u) + 8 * 2800)
    assert d["energy_kwh_per_step"] == pytest.approx(d["step_time_s"] * watts / 3.6e6, rel=1e-12)


def test_run_energy_splits_stepping_and_standing_time():
    d = evaluate(load_scenario("scenarios/quickstart.yaml"), "analytic").to_dict()
    days, useful_days = d["time_to_train_days"], d["time_to_train_days_no_failures"]
    kw_step, kw_idle = d["power_kw"], 1.1 * (64 * 68 + 8 * 2800) / 1e3
    kwh = d["energy_kwh_to_train"]
    # every second of the run draws between the standing and the stepping power
    assert days * 24 * kw_idle < kwh < days * 24 * kw_step
    assert kwh > useful_days * 24 * kw_step


def test_power_cap_lowers_the_clock_by_the_cube_root_of_dynamic_power():
    # (500 - 68) / (700 - 68) = 0.68354; cube root 0.88086
    assert clock_ratio(500, 68, 700) == pytest.approx(0.68354 ** (1 / 3), rel=1e-4)
    base = evaluate(load_scenario("scenarios/quickstart.yaml"), "analytic")
    capped = evaluate(load_scenario("scenarios/quickstart.yaml", {"training.power.cap_w": 500}), "analytic")
    slow = base.breakdown_s["compute"] / clock_ratio(500, 68, 700)
    # GEMMs slow down by the clock, memory-bound kernels not at all
    assert base.breakdown_s["compute"] < capped.breakdown_s["compute"] <= slow * (1 + 1e-12)
    assert capped.peak_flops_per_device == base.peak_flops_per_device  # MFU stays against the datasheet peak
    assert capped.mfu < base.mfu
    assert capped.to_dict()["power_kw"] < base.to_dict()["power_kw"]


def test_a_cap_below_the_idle_power_is_refused():
    with pytest.raises(InputError, match="training.power.cap_w"):
        evaluate(load_scenario("scenarios/quickstart.yaml", {"training.power.cap_w": 50}))
