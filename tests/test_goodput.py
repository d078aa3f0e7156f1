"""Failures, checkpoints and restarts: Young/Daly worked by hand, the Llama 3 target."""

import math

import pytest

from simulator import evaluate, load_scenario
from simulator.evaluate import compile_scenario
from simulator.goodput import checkpoint_bytes, failure_rate_per_s, goodput_fraction, young_daly_interval_s
from simulator.training import Failures

HOUR, DAY = 3600.0, 86400.0


def test_young_interval_and_lost_work_of_a_worked_example():
    # a 60 s blocking checkpoint, one failure every 6 hours, a 10-minute restart
    c, m, r = 60.0, 6 * HOUR, 600.0
    tau = young_daly_interval_s(c, m)
    assert tau == pytest.approx(1609.968944, rel=1e-9)  # sqrt(2 * 60 * 21600) = sqrt(2,592,000)
    lost = (tau + c) / 2  # a failure lands uniformly in the 1669.97 s period
    assert lost == pytest.approx(834.984472, rel=1e-9)
    # waste (600 + 834.98) / 21600 = 0.0664345; 1 - that over 1 + 60/1609.97 = 1.0372678
    g = goodput_fraction(tau, c, r, 0.0, 1 / m, 0.0, 0.0)
    assert g == pytest.approx(0.9335655 / 1.0372678, rel=1e-6)


def test_young_interval_is_the_best_first_order_interval():
    c, m = 60.0, 6 * HOUR
    tau = young_daly_interval_s(c, m)
    # without restarts the waste c/tau + tau/(2m) is smallest at Young's interval
    waste = [c / t + t / (2 * m) for t in (0.8 * tau, tau, 1.25 * tau)]
    assert waste[1] < waste[0] and waste[1] < waste[2]


def test_a_job_that_fails_faster_than_it_restarts_makes_no_progress():
    assert goodput_fraction(100.0, 10.0, 3600.0, 0.0, 1 / 1800.0, 0.0, 0.0) == 0.0


def test_component_failures_scale_with_the_cluster_counts():
    f = Failures(gpu_mtbf_hours=1000.0, host_mtbf_hours=2000.0, nic_mtbf_hours=4000.0, network_mtbf_hours=8000.0,
                 software_mtbf_hours=2000.0)
    # 16 GPUs, 2 hosts, 16 NICs: 16/1000 + 2/2000 + 2/2000 + 16/4000 + 16/8000 = 0.024 per hour
    assert failure_rate_per_s(f, 16, 2, 16) * HOUR == pytest.approx(0.024)
    assert failure_rate_per_s(Failures(mtbf_hours_per_1000_devices=50.0), 2000, 250, 2000) * HOUR == \
        pytest.approx(2 / 50.0)


def test_default_component_rates_give_the_llama3_unexpected_interruptions():
    # the defaults come from Llama 3's Table 5: 419 unexpected interruptions in 54 days on
    # 16,384 GPUs, 2,048 hosts and 16,384 NICs
    rate = failure_rate_per_s(Failures(), 16384, 2048, 16384)
    assert rate * 54 * DAY == pytest.approx(419, rel=2e-3)


def test_checkpoint_holds_weights_and_optimizer_states_of_every_parameter():
    s = load_scenario("scenarios/quickstart.yaml")
    # bf16 weights (2 B) + fp32 master weights and Adam moments (12 B), once per parameter
    assert float(checkpoint_bytes(compile_scenario(s))) == pytest.approx(s.model.params() * 14, rel=1e-9)


def test_checkpoint_interval_is_young_of_the_write_time_and_the_job_mtbf():
    s = load_scenario("scenarios/quickstart.yaml")
    d = evaluate(s, "analytic").to_dict()
    write_s = s.model.params() * 14 / min(8 * 50e9, 2000e9)  # 8 nodes x 50 GB/s, network-fs
    per_hour = 64 / 79_200 + 8 / 57_700 + 8 / 42_100 + 64 / 3.03e6 + 64 / 607_000
    assert d["checkpoint_write_s"] == pytest.approx(write_s, rel=1e-9)
    assert d["failure_mtbf_hours"] == pytest.approx(1 / per_hour, rel=1e-9)
    assert d["checkpoint_interval_s"] == pytest.approx(math.sqrt(2 * write_s * HOUR / per_hour), rel=1e-9)


def test_asynchronous_checkpoints_stall_only_for_the_copy_to_host_memory():
    base = load_scenario("scenarios/quickstart.yaml")
    s = load_scenario("scenarios/quickstart.yaml", {"training.checkpoint.mode": "async"})
    d = evaluate(s, "analytic").to_dict()
    # each of the 64 devices copies 1/64 of the checkpoint over its half of a 64 GB/s PCIe
    # uplink (two GPUs per switch on a DGX H100)
    assert d["checkpoint_stall_s"] == pytest.approx(base.model.params() * 14 / 64 / 32e9, rel=1e-9)
    assert d["checkpoint_interval_s"] >= d["checkpoint_write_s"] - d["checkpoint_stall_s"]
    assert d["goodput"] > evaluate(base, "analytic").to_dict()["goodput"]


def test_llama3_405b_goodput_with_the_papers_interruptions_is_above_90_percent():
    # Llama 3 paper Sec. 3.3.4: 466 interruptions (419 unexpected) in 54 days; "higher than
    # 90% effective training time"
    d = evaluate(load_scenario("scenarios/llama3-405b-16k-h100.yaml"), "analytic").to_dict()
    assert 0.90 < d["goodput"] < 1.0
    per_54_days = d["interruptions"] / d["time_to_train_days"] * 54
    assert per_54_days == pytest.approx(466, rel=2e-3)


@pytest.mark.parametrize("field, value, says", [
    ("training.checkpoint.mode", "sometimes", "training.checkpoint.mode"),
    ("training.checkpoint.storage", "local-nvme", "training.checkpoint.storage"),
    ("training.checkpoint.storage", "tape", "training.checkpoint.storage"),
    ("training.failures.gpu_mtbf_hours", 0, "training.failures.gpu_mtbf_hours"),
    ("training.restart.detection_s", "fast", "training.restart.detection_s"),
])
def test_bad_whole_run_inputs_are_refused_naming_the_field(field, value, says):
    from simulator import InputError

    with pytest.raises(InputError, match=says):
        load_scenario("scenarios/quickstart.yaml", {field: value})
