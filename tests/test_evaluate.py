"""evaluate(): the JSON contract, arithmetic of throughput and cost, and a few physical laws."""

import json
import subprocess
import sys

import pytest

from simulator import evaluate, load_scenario

CONTRACT = ("feasible", "reason", "step_time_s", "tokens_per_s", "tokens_per_s_per_device", "model_tflops_per_device",
            "hardware_tflops_per_device", "mfu", "hfu", "peak_memory_gib", "memory_gib", "breakdown_s",
            "cost_usd_per_step", "usd_per_million_tokens", "time_to_train_days", "cost_to_train_usd")


def test_json_output_has_every_contract_key():
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "evaluate", "scenarios/quickstart.yaml", "--json"],
                          capture_output=True, text=True, check=True)
    d = json.loads(proc.stdout)
    assert all(k in d for k in CONTRACT)
    assert set(d["memory_gib"]) == {"weights", "gradients", "optimizer", "activations", "other"}


def test_breakdown_sums_to_step_time(scenario):
    d = evaluate(scenario(tp=2, pp=2, micro_batch=2, global_batch=64, recompute="full")).to_dict()
    assert sum(d["breakdown_s"].values()) == pytest.approx(d["step_time_s"], rel=1e-12)


def test_throughput_and_cost_follow_from_step_time(scenario):
    s = scenario(tp=1, pp=1, micro_batch=1, global_batch=64)
    d = evaluate(s).to_dict()
    tokens = 64 * s.model.seq_len
    assert d["tokens_per_s"] == pytest.approx(tokens / d["step_time_s"])
    assert d["cost_usd_per_step"] == pytest.approx(d["step_time_s"] * 8 * s.cluster.accelerator.price_usd_per_hour / 3600)
    assert d["usd_per_million_tokens"] == pytest.approx(d["cost_usd_per_step"] / tokens * 1e6)


def test_time_and_cost_to_train_scale_with_tokens():
    s = load_scenario("scenarios/quickstart.yaml")
    d = evaluate(s).to_dict()
    assert d["time_to_train_days_no_failures"] == pytest.approx(1.5e13 / d["tokens_per_s"] / 86400)
    assert d["cost_to_train_usd_no_failures"] == pytest.approx(1.5e13 / 1e6 * d["usd_per_million_tokens"])


def test_a_plan_that_does_not_fit_has_a_reason_and_no_cost_or_run_to_train():
    s = load_scenario("scenarios/quickstart.yaml", {"plan.tp": 1, "plan.dp": 64, "plan.micro_batch": 16,
                                                    "plan.global_batch": 1024, "plan.sequence_parallel": False})
    d = evaluate(s).to_dict()
    assert not d["feasible"] and d["reason"].startswith("out of memory")
    assert d["step_time_s"] > 0  # the schedule's prediction, as it would run with the memory
    for key in ("cost_usd_per_step", "usd_per_million_tokens", "time_to_train_days", "cost_to_train_usd",
                "time_to_train_days_no_failures", "cost_to_train_usd_no_failures", "energy_kwh_to_train"):
        assert d[key] is None, key


def test_time_and_cost_to_train_include_failures_and_energy():
    d = evaluate(load_scenario("scenarios/quickstart.yaml")).to_dict()
    days = d["time_to_train_days_no_failures"] / d["goodput"]
    assert d["time_to_train_days"] == pytest.approx(days, rel=1e-12)
    device_usd = days * 24 * 64 * d["price_usd_per_device_hour"]
    assert d["cost_to_train_usd"] == pytest.approx(device_usd + d["energy_cost_to_train_usd"], rel=1e-12)
    assert d["energy_cost_to_train_usd"] == pytest.approx(0.08 * d["energy_kwh_to_train"])


def test_hfu_exceeds_mfu_by_the_recomputed_flops(scenario):
    d = evaluate(scenario(micro_batch=1, global_batch=8, recompute="full", flash_attention=False)).to_dict()
    m = scenario().model
    l, h, s, V = m.layers, m.hidden, m.seq_len, m.vocab
    # hardware: the unfused path executes Megatron's full-recompute formula; model: causal half
    ratio = (96 * (1 + s / (6 * h) + V / (16 * l * h))) / (72 * (1 + s / (12 * h) + V / (12 * l * h)))
    assert d["hfu"] / d["mfu"] == pytest.approx(ratio, rel=1e-9)


def test_price_override_changes_cost_not_time():
    base = evaluate(load_scenario("scenarios/quickstart.yaml")).to_dict()
    cheap = evaluate(load_scenario("scenarios/quickstart.yaml", {"training.price_usd_per_device_hour": 1.0})).to_dict()
    assert cheap["step_time_s"] == base["step_time_s"]
    assert cheap["cost_usd_per_step"] == pytest.approx(base["step_time_s"] * 64 * 1.0 / 3600)


def test_more_micro_batches_shrink_the_bubble_fraction(scenario):
    few = evaluate(scenario(pp=4, micro_batch=1, global_batch=8)).to_dict()
    many = evaluate(scenario(pp=4, micro_batch=1, global_batch=64)).to_dict()
    frac = lambda d: d["breakdown_s"]["pipeline_bubble"] / d["step_time_s"]
    assert frac(many) < frac(few)


def test_interleaving_divides_the_bubble_by_vpp(scenario):
    one = evaluate(scenario(pp=4, micro_batch=1, global_batch=32)).to_dict()
    two = evaluate(scenario(pp=4, vpp=2, schedule="interleaved", micro_batch=1, global_batch=32)).to_dict()
    # pp send/recv doubles with two chunks; compare the compute-only share of the bubble
    assert two["breakdown_s"]["pipeline_bubble"] < 0.6 * one["breakdown_s"]["pipeline_bubble"]


def test_cli_flags_override_the_file():
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "evaluate", "scenarios/quickstart.yaml", "--json",
                           "--tp", "4", "--set", "plan.micro_batch=1"], capture_output=True, text=True, check=True)
    d = json.loads(proc.stdout)
    ref = evaluate(load_scenario("scenarios/quickstart.yaml", {"plan.tp": 4, "plan.dp": 16, "plan.micro_batch": 1}))
    assert d["step_time_s"] == ref.step_time_s


def test_same_inputs_give_bit_identical_output():
    """Bit-identical apart from `diagnostics`, the graph engine's wall-clock time (a measurement)."""
    def run(*flags):
        out = subprocess.run([sys.executable, "-m", "simulator.cli", "evaluate", "scenarios/gpt3-175b-1024xa100.yaml",
                              *flags], capture_output=True, text=True, check=True).stdout
        if flags:
            d = json.loads(out)
            assert d.pop("diagnostics")["simulation_s"] > 0
            return d
        return out
    assert run("--json") == run("--json")
    assert run() == run()  # the human report holds no wall-clock time


@pytest.mark.parametrize("node, accelerator", [("dgx-h200", "h200-sxm-141gb"), ("dgx-h100", "h100-sxm-80gb")])
def test_result_says_whether_its_profile_was_validated_against_runs_and_why(node, accelerator):
    import yaml

    from simulator.hardware import profiles_dir
    from simulator.report import render_result
    from simulator.scenario import scenario_from_dict

    profile = yaml.safe_load((profiles_dir() / "accelerators" / f"{accelerator}.yaml").read_text())["validation"]
    s = scenario_from_dict({"model": {"preset": "llama-3.1-8b", "seq_len": 4096}, "cluster": {"node": node, "nodes": 1},
                            "plan": {"dp": 8, "micro_batch": 1, "global_batch": 8, "zero_stage": 3}})
    d = evaluate(s).to_dict()
    assert (d["profile_validated"], d["profile_validation"]) == (profile["validated"], profile["reason"])
    said = f"{accelerator} is not validated against measured runs: {profile['reason']}" in render_result(d, s)
    assert said == (not profile["validated"])


def test_a_result_shows_itself_in_a_few_lines_naming_fit_speed_memory_and_run():
    result = evaluate(load_scenario("scenarios/quickstart.yaml"))
    d, shown = result.to_dict(), repr(result).splitlines()
    assert len(shown) == 5 and shown[0].endswith(": fits")
    assert f"step {d['step_time_s']:.4g} s" in shown[1] and f"MFU {100 * d['mfu']:.1f} %" in shown[1]
    assert f"peak memory {d['peak_memory_gib']:.1f} GiB of {d['memory_capacity_gib']:.1f}" in shown[2]
    assert f"in {d['time_to_train_days']:.3g} days" in shown[3]
    oom = evaluate(load_scenario("scenarios/quickstart.yaml", {"plan.tp": 1, "plan.dp": "auto", "plan.micro_batch": 8,
                                                                "plan.recompute": "none"}))
    assert f"does not fit: {oom.reason}" in repr(oom) and "days" not in repr(oom)
