"""`evaluate --sensitivity`: the step time with one hardware rate 10 % lower and higher."""

import json
from dataclasses import replace

import pytest
import yaml

from simulator import evaluate, load_scenario
from simulator.cli import main
from simulator.hardware import profiles_dir
from simulator.sensitivity import FACTORS, STEP, sensitivities

ONE_DEVICE = {"model.preset": "megatron-gpt-1.7b", "cluster.nodes": 1, "cluster.devices_per_node": 1,
              "plan.tp": 1, "plan.pp": 1, "plan.dp": 1, "plan.micro_batch": 1, "plan.global_batch": 4}


def by_name(found):
    return {s.factor: s for s in found}


OFFLOADS = {"on-device": {}, "cpu-adam": {"plan.offload.optimizer": "cpu"},
            "nvme": {"plan.offload.optimizer": "nvme", "plan.zero_stage": 3},
            "cpu-params": {"plan.offload.optimizer": "cpu", "plan.offload.params": "cpu", "plan.zero_stage": 3}}


@pytest.mark.parametrize("offload", OFFLOADS.values(), ids=OFFLOADS.keys())
def test_a_one_device_step_is_all_kernel_host_and_offload_time_so_every_rate_faster_is_as_much_faster(offload):
    scenario = load_scenario("quickstart", {**ONE_DEVICE, **offload})
    cluster = scenario.cluster
    for factor in FACTORS:
        cluster = factor.faster(cluster, 1.1)
    base, faster = evaluate(scenario).step_time_s, evaluate(replace(scenario, cluster=cluster)).step_time_s
    assert faster == pytest.approx(base / 1.1, rel=1e-12)


def test_one_device_waits_on_no_link():
    s = by_name(sensitivities(load_scenario("quickstart", ONE_DEVICE)))
    for link in ("scale-up link", "scale-out network", "host link"):
        assert s[link].step_time_s_lower == s[link].step_time_s_higher and s[link].elasticity == 0.0


def test_one_node_waits_on_no_network_but_on_its_scale_up_link():
    s = by_name(sensitivities(load_scenario("quickstart", {"cluster.nodes": 1, "plan.dp": 4, "plan.micro_batch": 1})))
    assert s["scale-out network"].elasticity == 0.0
    assert s["scale-up link"].elasticity < 0  # TP 2 all-gathers and reduce-scatters over NVLink


def test_a_faster_gemm_rate_is_the_profile_edited_by_hand(tmp_path):
    data = yaml.safe_load((profiles_dir() / "accelerators" / "h100-sxm-80gb.yaml").read_text())
    for curve in ("matmul", "matmul_fp8"):
        data["efficiency"][curve]["max"] *= 1 + STEP
    edited = tmp_path / "h100-faster-gemms.yaml"
    edited.write_text(yaml.safe_dump(data))
    by_hand = evaluate(load_scenario("quickstart", {"cluster.accelerator": str(edited)})).step_time_s
    assert by_name(sensitivities(load_scenario("quickstart")))["GEMM rate"].step_time_s_higher == by_hand


def test_a_lower_rate_never_speeds_the_step_up_and_slows_it_at_most_in_proportion():
    base = evaluate(load_scenario("published/tt_t5_405B_512gpu_1F1B")).step_time_s
    for s in sensitivities(load_scenario("published/tt_t5_405B_512gpu_1F1B")):
        assert base <= s.step_time_s_lower <= base / (1 - STEP) * (1 + 1e-12)
        assert base / (1 + STEP) * (1 - 1e-12) <= s.step_time_s_higher <= base


def test_cli_prints_and_serialises_the_sensitivities(capsys):
    assert main(["evaluate", "quickstart", "--sensitivity", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["sensitivity"]
    assert got["step"] == STEP and [f["factor"] for f in got["factors"]] == [f.name for f in FACTORS]
    assert main(["evaluate", "quickstart", "--sensitivity"]) == 0
    assert "sensitivity: the step time with one rate of the profile 10% lower or higher" in capsys.readouterr().out


def test_a_plan_that_does_not_fit_has_no_sensitivity(capsys):
    assert main(["evaluate", "quickstart", "--tp", "1", "--micro-batch", "8", "--recompute", "none",
                 "--sensitivity", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sensitivity"] is None


def test_an_offloading_plan_that_fits_at_the_profiles_rates_may_not_at_a_slower_host_link():
    """Activations offloaded to the host (drawn at random by the property tests: Llama 2 13B at
    32k tokens, DualPipe-V over 8 stages): the graph engine frees each once its copy has
    finished, so at a 10 % slower host link more are alive at once and the plan, at 79.3 GiB of
    80 on an H100, no longer fits. Its sensitivities are reported, that side marked, instead of
    none (the step time there is still the plan's, slower)."""
    from simulator import scenario_from_dict
    plan = {"tp": 2, "pp": 8, "dp": 1, "schedule": "dualpipe-v", "micro_batch": 1, "global_batch": 16,
            "recompute": "op-selective", "zero_stage": 3, "offload": {"activations": "cpu"}, "tp_comm_overlap": True,
            "compile": True, "tp_overlap": "userbuffers", "grad_accumulation_fusion": False,
            "attention_kernel": "fused", "zero3_impl": "fsdp2", "fsdp_reshard_after_forward": False,
            "fp32_params": True, "grad_clip": "none", "loss": "unfused", "dp_overlap": False,
            "pipeline_split": "balanced"}
    s = scenario_from_dict({"model": {"preset": "llama-2-13b", "seq_len": 32768, "document_tokens": 256},
                            "cluster": {"node": "dgx-h100", "nodes": 2}, "plan": plan})
    base = evaluate(s)
    assert base.feasible
    found = by_name(sensitivities(s))
    host, gemm = found.pop("host link"), found.pop("GEMM rate")
    assert not host.fits_lower and host.fits_higher
    assert base.step_time_s < host.step_time_s_lower <= base.step_time_s / (1 - STEP)
    assert gemm.fits_lower and not gemm.fits_higher  # faster kernels outrun the copies likewise
    assert all(f.fits_lower and f.fits_higher for f in found.values())
    from simulator.report import render_sensitivity
    shown = render_sensitivity({"step": STEP, "factors": [host.to_dict(base.step_time_s)]})
    assert f"{100 * (host.step_time_s_lower / base.step_time_s - 1):+.1f}% (out of memory)" in shown
