"""Weights, gradients and optimizer states per device (Rajbhandari et al. 2020, ZeRO, Sec. 5)."""

import pytest

from simulator.plan import Offload, Plan
from simulator.states import bytes_per_param, model_states

PSI = 1.0e9  # parameters on the device before sharding
ND = 64


def model_state_bytes(params, plan):
    """(weights, gradients, optimizer) bytes on a device holding `params` before sharding."""
    s = model_states(params, plan, bytes_per_param(plan.precision, plan.grad_precision), plan.dp * plan.cp)
    return s.weights_bytes, s.gradients_bytes, s.optimizer_bytes


def states(**kw):
    return sum(model_state_bytes(PSI, Plan(dp=ND, **kw)))


def test_mixed_precision_adam_is_16_bytes_per_parameter_with_16bit_grads():
    assert states(grad_precision="bf16") == 16 * PSI


def test_megatron_fp32_main_grads_make_18_bytes_per_parameter():
    assert states(grad_precision="fp32") == 18 * PSI


def test_precision_aware_adam_keeps_fp32_main_parameters_and_bf16_moments():
    """Megatron-Core's precision-aware optimizer with bf16 exp_avg and exp_avg_sq: 4 + 2 + 2 B of
    states, beside 2 B weights and bf16 main gradients."""
    per = bytes_per_param("bf16", "bf16", "bf16-moments")
    assert (per.weight, per.grad, per.optimizer) == (2.0, 2.0, 4.0 + 2.0 + 2.0)


def test_param_remainders_complete_the_bf16_weight_to_an_fp32_master_in_2_bytes():
    """Apex DistributedFusedAdam / TE FusedAdam store_param_remainders: an int16 shard beside the
    two fp32 moments, 2 + 4 + 4 B; with bf16 moments (Megatron's precision-aware optimizer) 2 + 2 + 2."""
    assert bytes_per_param("bf16", "fp32", "fp32", master_weights="remainders").optimizer == 2 + 4 + 4
    assert bytes_per_param("bf16", "bf16", "bf16-moments", master_weights="remainders").optimizer == 2 + 2 + 2


def test_an_optimizer_without_a_master_copy_keeps_only_its_bf16_moments():
    """Apex DistributedFusedAdam with dtype bf16 and store_params false: exp_avg and exp_avg_sq, 2 + 2 B."""
    assert bytes_per_param("bf16", "bf16", "bf16", master_weights="none").optimizer == 2 + 2


def test_adam_over_remainders_reads_and_writes_the_bf16_weight_with_them():
    from simulator.compute import memory_bound_time
    from simulator.hardware import load_accelerator
    from simulator.states import optimizer_step_s

    acc = load_accelerator("h100-sxm-80gb")
    plan = Plan(dp=ND, zero_stage=1, master_weights="remainders")
    per = bytes_per_param("bf16", "fp32", master_weights="remainders")
    s = model_states(PSI, plan, per, ND)
    assert s.optimizer_bytes == pytest.approx(10 * PSI / ND)
    # gradient read (4), moments and remainders read and written (2 x 10), bf16 weight read and written (4)
    assert optimizer_step_s(s, per, plan, acc) == pytest.approx(memory_bound_time(PSI / ND * 28, acc, "optimizer",
                                                                                  "bf16"))


def test_zero1_shards_the_12_optimizer_bytes():
    assert states(grad_precision="bf16", zero_stage=1) == pytest.approx(4 * PSI + 12 * PSI / ND)


def test_zero2_also_shards_gradients():
    assert states(grad_precision="bf16", zero_stage=2) == pytest.approx(2 * PSI + 14 * PSI / ND)


def test_zero3_shards_everything():
    assert states(grad_precision="bf16", zero_stage=3) == pytest.approx(16 * PSI / ND)


def test_megatron_distributed_optimizer_is_6_plus_12_over_d():
    # Megatron-LM docs (distributed optimizer): bf16 params + fp32 grads replicated, 12 B sharded.
    assert states(grad_precision="fp32", zero_stage=1) == pytest.approx(6 * PSI + 12 * PSI / ND)


def test_fp32_training_keeps_4_4_8_bytes():
    assert states(precision="fp32") == 16 * PSI


def test_fp32_parameters_are_the_master_copy_16_bytes_with_fp32_grads():
    # FSDP2 over an fp32 model with a bf16 param_dtype: 4 B weights, 4 B grads, 8 B moments
    plan = Plan(dp=ND, zero_stage=3, grad_precision="fp32", fp32_params=True)
    per = bytes_per_param(plan.precision, plan.grad_precision, fp32_params=True)
    s = model_states(PSI, plan, per, ND)
    assert (s.weights_bytes, s.gradients_bytes, s.optimizer_bytes) == pytest.approx((4 * PSI / ND, 4 * PSI / ND,
                                                                                     8 * PSI / ND))
    assert per.weight == 2.0  # what the GEMMs read and the all-gathers move


def test_adam_over_fp32_parameters_reads_and_writes_them_in_place():
    from simulator.compute import memory_bound_time
    from simulator.hardware import load_accelerator
    from simulator.states import optimizer_step_s

    acc = load_accelerator("h100-sxm-80gb")
    plan = Plan(dp=ND, zero_stage=3, fp32_params=True)
    per = bytes_per_param("bf16", "fp32", fp32_params=True)
    s = model_states(PSI, plan, per, ND)
    # gradient read (4), moments read and written (16), fp32 parameter read and written (8)
    assert optimizer_step_s(s, per, plan, acc) == pytest.approx(memory_bound_time(PSI / ND * 28, acc, "optimizer",
                                                                                  "bf16"))


def test_context_parallel_ranks_join_the_sharding_group():
    w, g, o = model_state_bytes(PSI, Plan(dp=8, cp=4, zero_stage=1))
    assert o == pytest.approx(12 * PSI / 32)


def test_optimizer_offload_leaves_no_optimizer_state_on_device():
    w, g, o = model_state_bytes(PSI, Plan(dp=8, zero_stage=2, offload=Offload(optimizer="cpu")))
    assert (w, g, o) == (2 * PSI, 0.0, 0.0)


def test_offloaded_optimizer_states_fill_host_memory():
    from simulator.model import load_preset
    from simulator.states import stage_params

    model = load_preset("llama-2-70b")
    plan = Plan(tp=8, dp=4, zero_stage=2, global_batch=4, offload=Offload(optimizer="cpu"))
    params = stage_params(model, 8, model.layers, True, True, True)
    s = model_states(params, plan, bytes_per_param("bf16", "fp32"), 4)
    # 12 B of Adam state and 4 B of fp32 gradients per parameter, sharded over dp = 4
    assert s.host_bytes == pytest.approx(params * 16 / 4)


def test_plan_whose_offload_exceeds_host_memory_is_infeasible():
    from simulator import evaluate, scenario_from_dict

    s = scenario_from_dict({"model": {"preset": "llama-3.1-405b"}, "cluster": {"node": "dgx-h100", "nodes": 1},
                            "plan": {"tp": 8, "zero_stage": 3, "global_batch": 1, "recompute": "full",
                                     "offload": {"optimizer": "cpu", "params": "cpu"}}})
    d = evaluate(s).to_dict()
    # 405 B params x (2 weights + 4 grads + 12 optimizer) B = 7.3 TB > the DGX H100's 2 TiB host memory
    assert d["feasible"] is False and d["reason"].startswith("out of host memory")


def test_an_fp32_plan_keeps_four_bytes_of_weights_per_parameter(scenario):
    # fp32 training: weights and gradients 4 B each for every parameter, linears included
    # (no FP8 copies to swap in); ZeRO-0 on one device
    from simulator.evaluate import compile_scenario

    s = scenario(dp=1, micro_batch=1, global_batch=1, precision="fp32", cluster={"node": "dgx-a100", "nodes": 1,
                                                                                 "devices_per_node": 1})
    stage = compile_scenario(s).stages[0]
    assert stage.states.weights_bytes == stage.states.gradients_bytes == 4 * stage.params


@pytest.mark.parametrize("preset", ["qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b", "gpt-oss-120b", "llama-4-scout",
                                    "llama-4-maverick", "llama-3.1-8b", "olmo-2-7b"])
def test_a_device_holding_a_whole_layer_holds_every_parameter_the_model_counts_for_it(preset):
    # one device, no parallelism: the per-device split of a layer is the model's own count,
    # query and key norms included (Qwen3's 2 x 128 weights a layer)
    from simulator.model import load_preset
    from simulator.moe import layer_params_split
    from simulator.states import layer_params_local
    m = load_preset(preset)
    dense, moe_rest, routed = layer_params_split(m, 1, 1, 1)
    assert dense == m.dense_layer_params()
    if m.experts:
        assert moe_rest + routed == m.moe_layer_params()
    if m.attention != "mla":
        assert layer_params_local(m, 1) == m.dense_layer_params()


@pytest.mark.parametrize("plan, needle", [
    ({"master_weights": "remainders", "optimizer_precision": "bf16"}, "optimizer_precision fp32 or bf16-moments"),
    ({"master_weights": "none"}, "optimizer_precision bf16"),
    ({"master_weights": "remainders", "precision": "fp16"}, "bf16 weights only"),
    ({"master_weights": "remainders", "fp32_params": True}, "fp32_params"),
    ({"master_weights": "remainders", "precision": "fp8", "fp8_params": True}, "fp8_params"),
    ({"master_weights": "remainders", "offload": {"optimizer": "cpu"}}, "offload.optimizer"),
])
def test_a_master_copy_apart_from_the_weights_is_refused_where_no_optimizer_keeps_one(plan, needle):
    from simulator import InputError, scenario_from_dict

    data = {"model": {"preset": "llama-3.1-8b"}, "cluster": {"node": "dgx-h100", "nodes": 1},
            "plan": {"dp": 8, "zero_stage": 1, "global_batch": 8, **plan}}
    with pytest.raises(InputError, match="plan.master_weights.*" + needle):
        scenario_from_dict(data)
