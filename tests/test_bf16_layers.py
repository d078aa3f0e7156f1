"""FP8 plans with their first and last layers in BF16 (Megatron-Core's first_last_layers_bf16):
those layers run, keep and gather what a BF16 plan's layers do, on the ranks that hold them."""

from pathlib import Path

import pytest
import yaml

from simulator import InputError, evaluate, scenario_from_dict
from simulator.evaluate import compile_scenario
from simulator.importers import import_config
from simulator.vector import evaluate_many

IMPORTS = Path(__file__).parent / "data" / "imports"
H, KV, F, LAYERS = 4096, 1024, 14336, 32  # Llama 3.1 8B
# weights of one layer's linears, by hand: QKV h x (h + 2 kv), output h x h, SwiGLU 3 x h x f
LAYER_LINEARS = H * (H + 2 * KV) + H * H + 3 * H * F


def scenario(tp=1, pp=2, dp=4, model=None, **plan):
    base = {"tp": tp, "pp": pp, "dp": dp, "micro_batch": 1, "global_batch": 64, "precision": "fp8",
            "fp8_recipe": "current"}
    return scenario_from_dict({"model": model or {"preset": "llama-3.1-8b", "seq_len": 4096},
                               "cluster": {"node": "dgx-h100", "nodes": tp * pp * dp // 8},
                               "plan": {**base, **plan}})


def test_bf16_layers_drop_their_fp8_weight_copies():
    # TransformerEngine's per-tensor recipes keep an FP8 weight and its transpose (2 B per
    # linear weight) beside the BF16 one; a BF16 layer keeps none
    fp8 = evaluate(scenario()).memory_by_stage
    mixed = evaluate(scenario(bf16_layers_at_start=2, bf16_layers_at_end=1)).memory_by_stage
    assert fp8[0]["weights"] - mixed[0]["weights"] == pytest.approx(2 * LAYER_LINEARS * 2)
    assert fp8[1]["weights"] - mixed[1]["weights"] == pytest.approx(1 * LAYER_LINEARS * 2)


def test_a_rank_of_bf16_layers_holds_what_a_bf16_plans_rank_holds():
    # pp 2: rank 0 holds layers 0-15, all BF16 here; rank 1 stays FP8
    mixed = evaluate(scenario(bf16_layers_at_start=16)).memory_by_stage
    bf16 = evaluate(scenario(precision="bf16")).memory_by_stage
    fp8 = evaluate(scenario()).memory_by_stage
    assert mixed[0] == pytest.approx(bf16[0])
    assert mixed[1] == pytest.approx(fp8[1])
    assert mixed[0] != pytest.approx(fp8[0])


def test_a_bf16_layer_runs_as_long_as_a_bf16_plans_layer():
    # a stage's passes sum its layers (with the same embedding and BF16 head in every plan):
    # n of its 16 layers in BF16 add n/16 of the difference between the two plans' layers
    def passes(**plan):
        return compile_scenario(scenario(**plan)).stages[0].passes
    fp8, bf16, mixed = passes(), passes(precision="bf16"), passes(bf16_layers_at_start=3)
    for field in ("fwd_s", "bwd_input_s"):
        a, b = getattr(fp8, field), getattr(bf16, field)
        assert getattr(mixed, field) == pytest.approx(a + 3 / 16 * (b - a))
        assert a < getattr(mixed, field) < b


def test_only_the_ranks_holding_the_first_and_last_layers_change():
    fp8, mixed = (compile_scenario(scenario(pp=4, dp=2, **p)) for p in ({}, {"bf16_layers_at_start": 1,
                                                                            "bf16_layers_at_end": 1}))
    for a, b in zip(fp8.stages, mixed.stages):
        edge = a.stage in (0, 3)
        assert (a.passes.fwd_s != b.passes.fwd_s) == edge
        assert (a.states.weights_bytes != b.states.weights_bytes) == edge
    assert evaluate(scenario(pp=4, dp=2, bf16_layers_at_start=1, bf16_layers_at_end=1)).step_time_s > \
        evaluate(scenario(pp=4, dp=2)).step_time_s


def test_vectorised_plans_with_bf16_layers_equal_scalar_evaluate():
    scenarios = [scenario(pp=pp, dp=8 // pp, micro_batch=mb, bf16_layers_at_start=1, bf16_layers_at_end=2)
                 for pp in (1, 2, 4) for mb in (1, 2)]
    for s, got in zip(scenarios, evaluate_many(scenarios)):
        want = evaluate(s, engine="analytic").to_dict()
        assert got["step_time_s"] == pytest.approx(want["step_time_s"], rel=1e-12)
        for a, b in zip(want["memory_gib_by_stage"], got["memory_gib_by_stage"]):
            assert b == pytest.approx(a, rel=1e-12)


@pytest.mark.parametrize("plan, field", [
    ({"fp8_recipe": "delayed", "bf16_layers_at_start": 1}, "plan.bf16_layers_at_start"),
    ({"precision": "bf16", "bf16_layers_at_end": 1}, "plan.bf16_layers_at_end"),
    ({"bf16_layers_at_start": 17}, "plan.bf16_layers_at_start"),  # the first stage holds 16
    ({"pp": 1, "dp": 8, "bf16_layers_at_start": 20, "bf16_layers_at_end": 20}, "plan.bf16_layers_at_end"),
    ({"bf16_layers_at_start": -1}, "plan.bf16_layers_at_start"),
])
def test_bf16_layers_llmsim_cannot_place_are_refused(plan, field):
    with pytest.raises(InputError) as e:
        scenario(**plan)
    assert e.value.field == field


def test_bf16_layers_of_a_mixture_of_experts_model_are_refused():
    with pytest.raises(InputError) as e:
        scenario(pp=1, dp=8, model={"preset": "mixtral-8x7b", "seq_len": 4096}, bf16_layers_at_end=1)
    assert e.value.field == "plan.bf16_layers_at_end"


def test_megatron_first_last_layers_bf16_keeps_one_layer_at_each_end_by_default(tmp_path):
    args = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --micro-batch-size 1 "
            "--global-batch-size 64 --bf16 --fp8-format hybrid --fp8-recipe tensorwise --first-last-layers-bf16")
    for extra, want in (("", (1, 1)), (" --num-layers-at-start-in-bf16 0 --num-layers-at-end-in-bf16 4", (0, 4))):
        path = tmp_path / "run.sh"
        path.write_text("torchrun pretrain_gpt.py " + args + extra + "\n")
        plan = import_config("megatron", path, {"cluster.node": "dgx-h100"}).scenario["plan"]
        assert (plan.get("bf16_layers_at_start"), plan.get("bf16_layers_at_end")) == want


def test_megatron_first_last_layers_bf16_without_fp8_changes_nothing(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text("torchrun pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
                    "--seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 --first-last-layers-bf16\n")
    imported = import_config("megatron", path, {"cluster.node": "dgx-h100"})
    assert "bf16_layers_at_start" not in imported.scenario["plan"]
    assert not imported.unmapped


@pytest.mark.parametrize("mixed_precision, want", [
    ({"first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 1}, (1, 1)),
    # Megatron-Bridge's MixedPrecisionConfig counts default to 0 and override the model's 1
    ({"first_last_layers_bf16": True, "num_layers_at_start_in_bf16": None, "num_layers_at_end_in_bf16": None},
     (0, 0)),
    ({"first_last_layers_bf16": False, "num_layers_at_start_in_bf16": 2, "num_layers_at_end_in_bf16": 2}, None),
])
def test_megatron_bridge_bf16_layers_come_from_its_mixed_precision_config(tmp_path, mixed_precision, want):
    data = yaml.safe_load((IMPORTS / "bridge-llama3_8b_sft_gb200_fp8_mx_v1.yaml").read_text())
    for key, value in mixed_precision.items():
        if value is None:
            del data["mixed_precision"][key]
        else:
            data["mixed_precision"][key] = value
    data["model"]["first_last_layers_bf16"] = True  # the model's own flag: overridden
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    plan = import_config("megatron", path, {"cluster.node": "dgx-b200"}).scenario["plan"]
    got = (plan["bf16_layers_at_start"], plan["bf16_layers_at_end"]) if "bf16_layers_at_start" in plan else None
    assert got == want
