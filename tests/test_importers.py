"""Importers: real public configs (tests/data/imports, sources in SOURCES.md) become the scenario
their authors ran, and every key of the source is accounted for."""

import dataclasses
import json
import re
import subprocess
import sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

import pytest
import yaml

from simulator import InputError, evaluate, scenario_from_dict
from simulator.model import model_from_dict
from simulator.evaluate import compile_scenario
from simulator.importers import import_config
from simulator.importers.common import flatten
from simulator.importers.launch_script import parse_args, script_words
from simulator.importers.torchtitan import split_layers, split_layers_2024

DATA = Path(__file__).parent / "data" / "imports"
HF = Path(__file__).parent / "data" / "hf"


def _plan(imported, *keys):
    return {k: imported.scenario["plan"].get(k) for k in keys}


def _accounted(imported) -> list:
    return [m["key"] for m in imported.mapped] + [m["key"] for m in imported.ignored + imported.unmapped]


@pytest.mark.parametrize("name", ["torchtitan-llama3_8b.toml", "torchtitan-llama3_70b.toml",
                                  "torchtitan-llama3_405b.toml", "torchtitan-deepseek_v3_671b.toml",
                                  "torchtitan-llama3_405b-202412.toml"])
def test_every_torchtitan_key_is_mapped_ignored_or_unmapped(name):
    imported = import_config("torchtitan", DATA / name, {"cluster.node": "dgx-h100", "cluster.nodes": 8})
    keys = set(flatten(tomllib.loads((DATA / name).read_text())))
    accounted = _accounted(imported)
    assert keys <= set(accounted)
    assert len(imported.ignored + imported.unmapped) == len({m["key"] for m in imported.ignored + imported.unmapped})
    scenario_from_dict(imported.scenario)  # a valid scenario


@pytest.mark.parametrize("old, new, key", [
    ('flavor = "8B"\n', 'flavor = ["8B", "70B"]\n', "model.flavor"),
    ("[training]\n", '[training]\nmixed_precision_param = ["bfloat16"]\n', "training.mixed_precision_param"),
    ("[model]\n", "[model]\nconverters = [1, 2]\n", "model.converters")])
def test_a_torchtitan_value_of_the_wrong_shape_is_refused_naming_the_key(tmp_path, old, new, key):
    (tmp_path / "c.toml").write_text((DATA / "torchtitan-llama3_8b.toml").read_text().replace(old, new, 1))
    with pytest.raises(InputError, match=f"torchtitan {key}"):
        import_config("torchtitan", tmp_path / "c.toml", {"cluster.node": "dgx-h100", "cluster.nodes": 8})


def test_torchtitan_deepseek_v3_as_shipped_evaluates_eager_with_op_level_ac():
    # its eager latent attention and MoE layers under op-level AC; without expert parallelism
    # every rank gathers every layer's 256 experts: out of memory, said so
    imported = import_config("torchtitan", DATA / "torchtitan-deepseek_v3_671b.toml",
                             {"cluster.node": "dgx-h100", "cluster.nodes": 32})
    result = evaluate(scenario_from_dict(imported.scenario), engine="analytic")
    assert not result.feasible and "out of memory" in result.reason


def test_torchtitan_llama3_8b_is_fsdp_with_a_local_batch_of_one_per_rank():
    imported = import_config("torchtitan", DATA / "torchtitan-llama3_8b.toml",
                             {"cluster.node": "dgx-a100", "cluster.nodes": 8})  # "a preset for 64 A100 GPUs"
    assert imported.scenario["model"] == {"preset": "llama-3.1-8b", "seq_len": 8192}
    # batch_size 1 per data-parallel rank x 64 FSDP ranks; 1000 steps of 64 x 8192 tokens
    assert _plan(imported, "tp", "pp", "cp", "dp", "zero_stage", "micro_batch", "global_batch", "recompute") == {
        "tp": 1, "pp": 1, "cp": 1, "dp": "auto", "zero_stage": 3, "micro_batch": 1, "global_batch": 64,
        "recompute": "op-selective"}  # selective_ac_option 'op': torchtitan's op-level policy
    assert imported.scenario["training"]["tokens"] == 1000 * 64 * 8192


def test_torchtitan_llama3_405b_maps_float8_its_fsdp_all_gather_and_async_tp():
    imported = import_config("torchtitan", DATA / "torchtitan-llama3_405b.toml",
                             {"cluster.node": "dgx-h100", "cluster.nodes": 16})  # "a preset for 128 H100 GPUs"
    assert _plan(imported, "tp", "sequence_parallel", "tp_comm_overlap", "precision", "recompute", "global_batch") == {
        "tp": 8, "sequence_parallel": True, "tp_comm_overlap": True, "precision": "fp8", "recompute": "full",
        "global_batch": 2 * 16}  # batch_size 2 x dp = 128 / 8
    # PyTorch's async TP over DTensor's parallel linears, which keep their gathered inputs
    assert _plan(imported, "tp_overlap", "tp_impl") == {"tp_overlap": "async-tp", "tp_impl": "dtensor"}
    # torchao's dynamic tensorwise scaling, the FSDP shards all-gathered in FP8 with precomputed scales
    assert _plan(imported, "fp8_recipe", "fp8_fsdp_all_gather", "zero_stage") == {
        "fp8_recipe": "tensorwise", "fp8_fsdp_all_gather": True, "zero_stage": 3}
    assert not {m["key"] for m in imported.unmapped} & {"float8.enable_fsdp_float8_all_gather",
                                                        "float8.precompute_float8_dynamic_scale_for_fsdp"}


# torchtitan's 405B config of Dec 2024 (@9dec370, parallelism in [training] and [experimental],
# Float8 by float8.enable_float8_linear) and of 2025 (@01424cb, [parallelism], converters): the same job
TITAN_405B_2024 = "torchtitan-llama3_405b-202412.toml"


def test_torchtitan_config_of_dec_2024_reads_as_its_2025_twin():
    cluster = {"cluster.node": "dgx-h100", "cluster.nodes": 16}
    old = import_config("torchtitan", DATA / TITAN_405B_2024, cluster).scenario["plan"]
    new = import_config("torchtitan", DATA / "torchtitan-llama3_405b.toml", cluster).scenario["plan"]
    # the norm is the one field the two files set differently: model.norm_type "rmsnorm" (torch
    # ops one by one) against the later default nn.RMSNorm; SDPA's kernel is that of each one's torch
    assert old.pop("eager_norm") == "composite" and new.pop("eager_norm") == "fused"
    assert old.pop("attention_kernel") == "flash2" and "attention_kernel" not in new
    assert old == new


def _set_keys(text: str, settings: dict) -> str:
    """A TOML text with each `section.key` set to the TOML value given, in its section (added
    at the end where the text has none)."""
    for dotted, value in settings.items():
        section, key = dotted.split(".")
        if f"[{section}]\n" not in text:
            text += f"\n[{section}]\n"
        start = text.index(f"[{section}]\n") + len(f"[{section}]\n")
        end = text.find("\n[", start) % (len(text) + 1)  # the section's end, or the text's
        kept = [line for line in text[start:end].split("\n") if not line.startswith(f"{key} =")]
        text = text[:start] + f"{key} = {value}\n" + "\n".join(kept) + text[end:]
    return text


def _titan(tmp_path, name: str, settings: dict, nodes: int = 1, **overrides):
    """The torchtitan fixture `name` with `settings` (_set_keys), imported."""
    (tmp_path / "c.toml").write_text(_set_keys((DATA / name).read_text(), settings))
    return import_config("torchtitan", tmp_path / "c.toml", {"cluster.node": "dgx-h100", "cluster.nodes": nodes,
                                                             **overrides})


def _titan_2024(tmp_path, model: str, nodes: int, settings: dict):
    """torchtitan@9dec370's config of `model` with `settings`, imported."""
    return _titan(tmp_path, f"torchtitan-llama3_{model}-202412.toml", settings, nodes)


def _assert_imports_as_row(imported, nodes: int, row: str, inert: set) -> None:
    """The imported plan is the published row's but for `inert` fields (on the row's 500 W
    H100s), and so is the prediction, bit for bit, under both engines."""
    from simulator.validation.runs import load_runs
    ours = scenario_from_dict({**imported.scenario, "cluster": {"node": "dgx-h100", "nodes": nodes,
                                                                "accelerator": "h100-sxm-96gb-500w"}})
    published = next(r for r in load_runs() if r.id == row).build()
    assert {f.name for f in dataclasses.fields(ours.plan)
            if getattr(ours.plan, f.name) != getattr(published.plan, f.name)} <= inert
    for engine in ("analytic", "graph"):
        a, b = evaluate(ours, engine), evaluate(published, engine)
        assert (a.step_time_s, a.peak_reserved_bytes) == (b.step_time_s, b.peak_reserved_bytes)


# torchtitan's Dec 2024 benchmarks (benchmarks/llama3_h100_202412_torchtitan.md, torchtitan@9dec370):
# each table's run as that commit's config of its model with the settings the table states
# (row id: config, nodes of 8 GPUs, settings)
COMPILE_FP8 = {"training.compile": "true", "float8.enable_float8_linear": "true"}
TABLE_PP = {"experimental.pipeline_parallel_degree": "8"}
TITAN_2024_ROWS = {
    "tt_t1_8B_8gpu_FSDP": ("8b", 1, {"training.batch_size": "2"}),
    "tt_t1_8B_8gpu_FSDP_compile": ("8b", 1, {"training.batch_size": "2", "training.compile": "true"}),
    "tt_t1_8B_8gpu_FSDP_compile_Float8": ("8b", 1, {"training.batch_size": "2", **COMPILE_FP8}),
    "tt_t3_8B_128gpu_FSDP_compile_Float8": ("8b", 16, {"training.batch_size": "2", **COMPILE_FP8}),
    **{f"tt_t2_8B_cp{cp}_seq{32768 * cp}": ("8b", 1, {
        "training.seq_len": str(32768 * cp), "experimental.context_parallel_degree": str(cp),
        "activation_checkpoint.mode": "'full'", **COMPILE_FP8}) for cp in (1, 2, 4, 8)},
    "tt_t4_70B_256gpu_2D": ("70b", 32, {"training.batch_size": "16", **COMPILE_FP8}),
    "tt_t4_70B_256gpu_2D_AsyncTP": ("70b", 32, {"training.batch_size": "16", **COMPILE_FP8,
                                                "experimental.enable_async_tensor_parallel": "true"}),
    "tt_t5_405B_512gpu_1F1B": ("405b", 64, {"training.batch_size": "32", **TABLE_PP,
                                            "experimental.pipeline_parallel_schedule": '"1F1B"'}),
    "tt_t5_405B_512gpu_Interleaved1F1B": ("405b", 64, {
        "training.batch_size": "32", **TABLE_PP, "experimental.pipeline_parallel_schedule": '"Interleaved1F1B"',
        "experimental.pipeline_parallel_microbatches": "8"}),
    **{f"tt_t6_405B_cp{cp}_seq{32768 * cp}": ("405b", 64, {
        "training.batch_size": "8", "training.seq_len": str(32768 * cp), **TABLE_PP,
        "experimental.context_parallel_degree": str(cp)}) for cp in (1, 8)},
}


@pytest.mark.parametrize("row", TITAN_2024_ROWS)
def test_torchtitan_dec_2024_config_imports_as_its_published_row(tmp_path, row):
    """The published rows' scenarios were written by hand from the benchmark's text and the code
    of that commit (scenarios/published/supplement-more-runs.yaml); its configs, read by the
    importer, give the same plans (pipeline stages as first/last counts or as a layout; the
    pipeline runtime and the CP ring named where there is no pipeline or CP) and so the same
    prediction."""
    model, nodes, settings = TITAN_2024_ROWS[row]
    imported = _titan_2024(tmp_path, model, nodes, settings)
    plan = imported.scenario["plan"]
    inert = {"pipeline_layout", "first_stage_layers", "last_stage_layers"} | \
        ({"pp_impl", "pp_outputs"} if plan["pp"] == 1 else set()) | ({"cp_attention"} if plan["cp"] == 1 else set())
    _assert_imports_as_row(imported, nodes, row, inert)


# torchtitan's Jun 2025 async TP benchmarks (benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md,
# torchtitan@820504e, torch 38410cf9 of 2025-06-14): 70B on 256 GPUs, full AC, local batch 16;
# 8B on 64 GPUs, op-level SAC, local batch 12; both FSDP x TP 8, compiled
TITAN_2025_RUNS = {"70B": ("70b", 32, {"training.local_batch_size": "16", "activation_checkpoint.mode": "'full'"}),
                   "8B": ("8b", 8, {"training.local_batch_size": "12"})}
TITAN_2025_QUANT = {"bf16": {},
                    "float8-tensorwise": {"model.converters": '"float8"', "float8.recipe_name": '"tensorwise"'},
                    "float8-rowwise": {"model.converters": '"float8"', "float8.recipe_name": '"rowwise"'}}


@pytest.mark.parametrize("size", TITAN_2025_RUNS)
@pytest.mark.parametrize("quant", TITAN_2025_QUANT)
@pytest.mark.parametrize("tp", ["vanillaTP", "asyncTP"])
def test_torchtitan_jun_2025_config_imports_as_its_published_row(tmp_path, size, quant, tp):
    """As the Dec 2024 rows: that commit's configs with the table's settings give the rows'
    hand-written plans, once told the torch of the run (SDPA's FlashAttention-2 before torch
    2.9; the config cannot say) and but for the eager norm, which compiled blocks do not run."""
    model, nodes, settings = TITAN_2025_RUNS[size]
    settings = {**settings, "training.compile": "true", "parallelism.tensor_parallel_degree": "8",
                **TITAN_2025_QUANT[quant]}
    if tp == "asyncTP":
        settings["parallelism.enable_async_tensor_parallel"] = "true"
    imported = _titan(tmp_path, f"torchtitan-llama3_{model}-202506.toml", settings, nodes,
                      **{"plan.attention_kernel": "flash2"})
    assert imported.scenario["plan"]["compile"]
    _assert_imports_as_row(imported, nodes, f"tt_asynctp_{size}_{quant}_{tp}", {"eager_norm"})


def test_torchtitan_dec_2024_interleaved_schedule_needs_its_micro_batch_count(tmp_path):
    # the default count was the PP degree until torchtitan@90567fc98 and the number of stages after
    _, nodes, interleaved = TITAN_2024_ROWS["tt_t5_405B_512gpu_Interleaved1F1B"]
    settings = {k: v for k, v in interleaved.items() if k != "experimental.pipeline_parallel_microbatches"}
    with pytest.raises(InputError, match="torchtitan experimental.pipeline_parallel_microbatches: .*90567fc98"):
        _titan_2024(tmp_path, "405b", nodes, settings)


@pytest.mark.parametrize("settings, key", [
    ({"experimental.pipeline_parallel_microbatches": "5"}, "experimental.pipeline_parallel_microbatches"),  # of 32
    ({"float8.scaling_type_weight": '"delayed"'}, "float8.scaling_type_weight"),
    ({"experimental.pipeline_parallel_schedule_csv": '"s.csv"'}, "experimental.pipeline_parallel_schedule_csv"),
    ({"parallelism.context_parallel_degree": "1"}, "training.data_parallel_replicate_degree")])  # both layouts
def test_torchtitan_dec_2024_config_refuses_what_llmsim_cannot_say(tmp_path, settings, key):
    _, nodes, table_5 = TITAN_2024_ROWS["tt_t5_405B_512gpu_1F1B"]
    with pytest.raises(InputError, match=f"torchtitan {key}"):
        _titan_2024(tmp_path, "405b", nodes, {**table_5, **settings})


@pytest.mark.parametrize("settings, key", [
    # torchft: the replicas' all-reduce runs over its own process group (gloo by default)
    ({"fault_tolerance.enable": "true", "fault_tolerance.group_size": "2"}, "fault_tolerance.enable"),
    ({"training.enable_cpu_offload": "true"}, "training.enable_cpu_offload"),  # torch's Adam on the CPU
    ({"training.dtype": '"bfloat16"'}, "training.dtype"),  # no fp32 copy, bf16 Adam moments
    ({"parallelism.tensor_parallel_degree": "8", "parallelism.enable_async_tensor_parallel": "true"},
     "parallelism.enable_async_tensor_parallel")])  # a compile pass, and this config is eager
def test_torchtitan_what_llmsim_cannot_say_is_refused(tmp_path, settings, key):
    with pytest.raises(InputError, match=f"torchtitan {key}"):
        _titan(tmp_path, "torchtitan-llama3_8b.toml", settings)


def test_torchtitan_split_before_2025_04_gives_the_last_stage_the_remainder():
    # torchtitan@9dec370 generate_split_points: first stage layers // stages, middle ones one
    # more while the remainder lasts; 126 layers: 15 + 6 x 16 + 15, 7 + 14 x 8 + 7; 32 over 3: 10, 11, 11
    assert split_layers_2024(126, 8) == [15] + [16] * 6 + [15]
    assert split_layers_2024(126, 16) == [7] + [8] * 14 + [7]
    assert split_layers_2024(32, 3) == [10, 11, 11]
    assert split_layers_2024(10, 4) == [2, 3, 3, 2]


def _torchtitan_edited(tmp_path, edits=(), name="torchtitan-deepseek_v3_671b.toml", nodes=32):
    """A torchtitan fixture (by default v0.2.2's DeepSeek-V3 671B config) with (old, new) edits of
    whole lines, imported."""
    text = (DATA / name).read_text()
    for old, new in edits:  # whole lines: "tensor_parallel_degree" is also in "expert_tensor_parallel_degree"
        assert f"\n{old}\n" in text
        text = text.replace(f"\n{old}\n", f"\n{new}\n", 1)
    f = tmp_path / "moe.toml"
    f.write_text(text)
    return import_config("torchtitan", f, {"cluster.node": "dgx-h100", "cluster.nodes": nodes})


def test_torchtitan_deepseek_v3_is_the_preset_without_its_mtp_module_attending_inside_documents():
    imported = import_config("torchtitan", DATA / "torchtitan-deepseek_v3_671b.toml",
                             {"cluster.node": "dgx-h100", "cluster.nodes": 32})
    # torchtitan v0.2.2's DeepSeekV3Model has no multi-token-prediction module
    assert imported.scenario["model"] == {"preset": "deepseek-v3", "mtp_layers": 0, "seq_len": 4096}
    why = {u["key"]: u["why"] for u in imported.unmapped}
    assert "model.document_tokens" in why["model.attn_mask_type"]  # the flavor's FlexAttention block_causal
    # torchtitan's own MoE layer, which weights the experts' rows after them (its flavor's
    # score_before_experts False) and whose op-level AC keeps the all-to-all outputs
    assert imported.scenario["plan"]["moe"] == {"dispatcher": "alltoall", "framework": "torchtitan",
                                                "grouped_gemm": True}
    # expert_parallel_degree 1: every rank holds every expert; no TP, so no expert TP either
    assert _plan(imported, "ep", "etp", "zero_stage") == {"ep": 1, "etp": 1, "zero_stage": 3}
    # [compile] enable with components ["loss"]: the model's kernels run eager
    assert _plan(imported, "compile") == {"compile": False}
    ignored = {m["key"] for m in imported.ignored}
    # the sections of converters the config leaves commented out, a schedule without a pipeline
    assert {"quantize.grouped_mm.float8.fqns", "quantize.linear.float8.filter_fqns",
            "parallelism.pipeline_parallel_schedule"} <= ignored


def test_torchtitan_expert_parallelism_folds_into_the_fsdp_ranks_beside_tp(tmp_path):
    imported = _torchtitan_edited(tmp_path, [("expert_parallel_degree = 1", "expert_parallel_degree = 32")])
    assert _plan(imported, "tp", "ep", "etp") == {"tp": 1, "ep": 32, "etp": 1}
    assert imported.scenario["plan"]["moe"] == {"dispatcher": "alltoall", "framework": "torchtitan",
                                                "grouped_gemm": True}
    # TP without EP: the experts split over the TP ranks (TensorParallel), whatever the ETP key says
    tp8 = _torchtitan_edited(tmp_path, [("tensor_parallel_degree = 1", "tensor_parallel_degree = 8")])
    assert _plan(tp8, "tp", "ep", "etp") == {"tp": 8, "ep": 1, "etp": 8}
    # TP with EP: expert TP 1 (the routed tokens split over the TP ranks) or the TP degree
    for etp in (1, 8):
        both = _torchtitan_edited(tmp_path, [("tensor_parallel_degree = 1", "tensor_parallel_degree = 8"),
                                             ("expert_parallel_degree = 1", "expert_parallel_degree = 32"),
                                             ("expert_tensor_parallel_degree = 1",
                                              f"expert_tensor_parallel_degree = {etp}")])
        assert _plan(both, "tp", "ep", "etp") == {"tp": 8, "ep": 32, "etp": etp}
    with pytest.raises(InputError, match="expert_tensor_parallel_degree"):  # 1 or TP
        _torchtitan_edited(tmp_path, [("expert_parallel_degree = 1", "expert_parallel_degree = 8"),
                                      ("expert_tensor_parallel_degree = 1", "expert_tensor_parallel_degree = 2")])


def test_torchtitan_deepseek_v3_with_full_ac_and_a_compiled_model_evaluates(tmp_path):
    imported = _torchtitan_edited(tmp_path, [("expert_parallel_degree = 1", "expert_parallel_degree = 64"),
                                          ('mode = "selective"  # ["none", "selective", "full"]', 'mode = "full"'),
                                          ('components = ["loss"] # ["model", "loss"]', 'components = ["model", "loss"]')],
                               nodes=64)
    assert _plan(imported, "recompute", "compile", "ep") == {"recompute": "full", "compile": True, "ep": 64}
    result = evaluate(scenario_from_dict(imported.scenario), engine="analytic")
    assert result.feasible and result.step_time_s > 0


def test_torchtitan_deepep_backend_is_refused_as_a_layer_not_modelled(tmp_path):
    # DeepEPMoE (models/moe/moe_deepep.py) is another layer: DeepEP weights the combine, the
    # shared experts run beside it
    deepep = ("expert_tensor_parallel_degree = 1", "expert_parallel_comm_backend = \"deepep\"\n"
                                                   "expert_tensor_parallel_degree = 1")
    with pytest.raises(InputError, match="expert_parallel_comm_backend.*moe_deepep"):
        _torchtitan_edited(tmp_path, [("expert_parallel_degree = 1", "expert_parallel_degree = 8"), deepep])


def test_torchtitan_qwen3_moe_flavor_imports_and_its_pipeline_is_refused(tmp_path):
    # the debug config at the 30B-A3B flavor (the debug flavor is no llmsim preset)
    edits = [('flavor = "debugmodel_moe"', 'flavor = "30B-A3B"'),
             ("expert_parallel_degree = 1", "expert_parallel_degree = 8")]
    imported = _torchtitan_edited(tmp_path, edits, name="torchtitan-qwen3_moe_debug.toml", nodes=1)
    assert imported.scenario["model"] == {"preset": "qwen3-30b-a3b", "seq_len": 4096}
    assert _plan(imported, "ep", "etp") == {"ep": 8, "etp": 1}
    with pytest.raises(InputError, match="pipeline"):  # torchtitan's qwen3 TrainSpec has no pipelining_fn
        _torchtitan_edited(tmp_path, edits + [("tensor_parallel_degree = 1", "tensor_parallel_degree = 1\n"
                                            "pipeline_parallel_degree = 2")],
                        name="torchtitan-qwen3_moe_debug.toml", nodes=1)
    with pytest.raises(InputError, match="no llmsim preset"):
        import_config("torchtitan", DATA / "torchtitan-qwen3_moe_debug.toml", {"cluster.node": "dgx-h100"})


def test_torchtitan_norm_type_of_older_configs_is_its_own_rmsnorm_run_op_by_op(tmp_path):
    # before pytorch/torchtitan#1115 the config chose torchtitan's norms.py: rmsnorm op by op,
    # fused_rmsnorm its Triton kernel; after it nn.RMSNorm (the fixture)
    edits = [('flavor = "8B"', 'flavor = "8B"\nnorm_type = "rmsnorm"')]
    old = _torchtitan_edited(tmp_path, edits, name="torchtitan-llama3_8b.toml", nodes=8)
    assert _plan(old, "eager_norm") == {"eager_norm": "composite"}
    triton = _torchtitan_edited(tmp_path, [(edits[0][0], edits[0][1].replace("rmsnorm", "fused_rmsnorm"))],
                                name="torchtitan-llama3_8b.toml", nodes=8)
    assert _plan(triton, "eager_norm") == {"eager_norm": "fused"}
    with pytest.raises(InputError, match="norm_type"):
        _torchtitan_edited(tmp_path, [(edits[0][0], edits[0][1].replace("rmsnorm", "layernorm"))],
                           name="torchtitan-llama3_8b.toml", nodes=8)


def test_torchtitan_qwen3_as_shipped_runs_its_moe_layer_eager_with_op_level_ac(tmp_path):
    # the debug config's eager model and op-level AC at the 30B-A3B flavor, EP 8 on 16 H100s
    edits = [('flavor = "debugmodel_moe"', 'flavor = "30B-A3B"'), ("local_batch_size = 4", "local_batch_size = 1"),
             ("expert_parallel_degree = 1", "expert_parallel_degree = 8")]
    imported = _torchtitan_edited(tmp_path, edits, name="torchtitan-qwen3_moe_debug.toml", nodes=2)
    assert _plan(imported, "compile", "recompute") == {"compile": False, "recompute": "op-selective"}
    # torch's nn.RMSNorm (torchtitan since #1115), one CUDA kernel eager since torch 2.8
    assert _plan(imported, "eager_norm") == {"eager_norm": "fused"}
    # qwen3's _op_sac_save_list has no all_to_all_single: the dispatch runs again in the recomputation
    assert imported.scenario["plan"]["moe"] == {"dispatcher": "alltoall", "framework": "torchtitan",
                                                "op_sac_saves_all_to_all": False, "grouped_gemm": True}
    assert evaluate(scenario_from_dict(imported.scenario), engine="analytic").feasible


def test_torchtitan_runs_grouped_gemm_experts_on_hopper_and_its_for_loop_on_ampere(tmp_path):
    # MoEArgs.use_grouped_mm is turned off below CUDA capability 9.0
    for node, grouped in (("dgx-h100", True), ("dgx-a100", False)):
        imported = import_config("torchtitan", DATA / "torchtitan-llama4_17bx16e.toml",
                                 {"cluster.node": node, "cluster.nodes": 8})
        assert imported.scenario["plan"]["moe"]["grouped_gemm"] is grouped


def test_torchtitan_llama4_as_shipped_splits_its_experts_over_tp_and_evaluates(tmp_path):
    # TP 8 without EP, eager, full AC, local batch 8 x 8192 tokens on 64 H100s
    imported = import_config("torchtitan", DATA / "torchtitan-llama4_17bx16e.toml",
                             {"cluster.node": "dgx-h100", "cluster.nodes": 8})
    assert _plan(imported, "tp", "ep", "etp", "sequence_parallel") == {"tp": 8, "ep": 1, "etp": 8,
                                                                       "sequence_parallel": True}
    assert evaluate(scenario_from_dict(imported.scenario), engine="analytic").feasible


def test_torchtitan_llama4_is_the_preset_attending_causally_with_rope_on_every_layer(tmp_path):
    edits = [("tensor_parallel_degree = 8", "tensor_parallel_degree = 1"),
             ("expert_tensor_parallel_degree = 8", "expert_tensor_parallel_degree = 1")]
    imported = _torchtitan_edited(tmp_path, edits + [("enable=false", "enable=true"),
                                                  ("local_batch_size = 8", "local_batch_size = 1")],
                               name="torchtitan-llama4_17bx16e.toml", nodes=8)
    # torchtitan's 17bx16e flavor: no NoPE layers, no chunked attention, no qk norms
    assert imported.scenario["model"] == {
        "preset": "llama-4-scout", "qk_norm": False, "qk_norm_kind": "norm", "nope_layer_interval": 0,
        "sliding_window": 0, "sliding_window_skip_freq": 0, "window_kind": "sliding", "seq_len": 8192}
    assert _plan(imported, "tp", "ep", "etp") == {"tp": 1, "ep": 1, "etp": 1}
    # MoEArgs' default score_before_experts: Llama 4 scales the routed rows before its experts
    assert imported.scenario["plan"]["moe"]["probs_on_input"] is True
    model = model_from_dict(imported.scenario["model"])
    assert not model.qk_norm and not model.has_sliding_window and model.rope_layer_share == 1.0
    assert evaluate(scenario_from_dict(imported.scenario), engine="analytic").feasible
    with pytest.raises(InputError, match="no llmsim preset"):  # NoPE on layers 0, 4, 8: not the preset's 3, 7, 11
        _torchtitan_edited(tmp_path, edits + [('flavor = "17bx16e"', 'flavor = "17bx16e_irope"')],
                        name="torchtitan-llama4_17bx16e.toml")


def test_a_dense_torchtitan_model_ignores_the_expert_keys(tmp_path):
    imported = _torchtitan_edited(tmp_path, [("[parallelism]", "[parallelism]\nexpert_parallel_degree = 8")],
                               name="torchtitan-llama3_70b.toml", nodes=1)
    assert "parallelism.expert_parallel_degree" in {m["key"] for m in imported.ignored}
    assert "ep" not in imported.scenario["plan"]


@pytest.mark.parametrize("name, compiled", [("torchtitan-llama3_8b.toml", False),  # training.compile = false
                                            ("torchtitan-llama3_405b.toml", True),  # training.compile = true
                                            ("torchtitan-llama3_70b.toml", False)])  # [compile] enable=false
def test_torchtitan_compile_switch_sets_fused_or_eager_kernels(name, compiled):
    imported = import_config("torchtitan", DATA / name, {"cluster.node": "dgx-h100"})
    assert imported.scenario["plan"]["compile"] is compiled


def test_torchtitan_without_a_compile_key_runs_eager(tmp_path):
    # JobConfig's CompileConfig.enable defaults to False (torchtitan/config/configs.py @b5bcd76)
    text = (DATA / "torchtitan-llama3_70b.toml").read_text().replace("enable=false\n", "")
    f = tmp_path / "no-enable.toml"
    f.write_text(text)
    assert import_config("torchtitan", f, {"cluster.node": "dgx-h100"}).scenario["plan"]["compile"] is False


@pytest.mark.parametrize("name, text", [
    # the head of what --debug.save_config_file writes (Trainer.Config.to_dict, torchtitan@b5bcd76)
    ("config.json", '{"model_spec": {"name": "llama3", "flavor": "8B", "model": {"dim": 4096}}, '
                    '"activation_checkpoint": {"preserve_rng_state": true}}'),
    ("config_registry.py", "def llama3_8b() -> Trainer.Config:\n    return Trainer.Config()\n")])
def test_torchtitan_python_configs_are_refused_naming_the_toml_era(tmp_path, name, text):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(InputError, match="v0.2.2 or earlier") as err:
        import_config("torchtitan", f, {"cluster.node": "dgx-h100"})
    assert "9810191bb" in str(err.value)


def test_torchtitan_block_causal_flex_attention_asks_for_the_documents_length(tmp_path):
    text = (DATA / "torchtitan-llama3_8b.toml").read_text().replace(
        "[model]\n", '[model]\nuse_flex_attn = true\nattn_mask_type = "block_causal"\n')
    f = tmp_path / "flex.toml"
    f.write_text(text)
    imported = import_config("torchtitan", f, {"cluster.node": "dgx-h100"})
    why = {u["key"]: u["why"] for u in imported.unmapped}
    assert "model.document_tokens" in why["model.attn_mask_type"] and "FlexAttention" in why["model.use_flex_attn"]
    causal = tmp_path / "causal.toml"
    causal.write_text((DATA / "torchtitan-llama3_8b.toml").read_text().replace(
        "[model]\n", '[model]\nattn_mask_type = "causal"\n'))
    imported = import_config("torchtitan", causal, {"cluster.node": "dgx-h100"})
    assert "model.attn_mask_type" in _accounted(imported)
    assert [u["key"] for u in imported.unmapped] == ["torch release"]  # SDPA's kernel: the torch's


@pytest.mark.parametrize("policy, pp, reshard", [(None, 1, True), (None, 2, False), ("always", 2, True),
                                                 ("never", 1, False)])
def test_torchtitan_fsdp_reshard_policy_keeps_parameters_gathered_under_pp_by_default(tmp_path, policy, pp, reshard):
    # get_fsdp_reshard_after_forward_policy: "default" reshards unless pipeline parallelism is on
    text = (DATA / "torchtitan-llama3_70b.toml").read_text().replace(
        "pipeline_parallel_degree = 1", f"pipeline_parallel_degree = {pp}")
    if policy:
        text = text.replace("[parallelism]\n", f'[parallelism]\nfsdp_reshard_after_forward = "{policy}"\n')
    f = tmp_path / "policy.toml"
    f.write_text(text)
    imported = import_config("torchtitan", f, {"cluster.node": "dgx-h100", "cluster.nodes": 8})
    assert imported.scenario["plan"]["fsdp_reshard_after_forward"] is reshard
    scenario_from_dict(imported.scenario)


def test_torchtitan_default_split_weighs_the_embedding_and_the_output_as_a_layer_each():
    # generate_split_points (torchtitan@01424cb) by hand: 126 + 2 effective layers over 8 x 2
    # stages = 8 each, the first and last holding 7 transformer layers; 32 + 2 over 4 single
    # stages = 8 rest 2: the first 8 - 1 + 1, the second 8 + 1, the third 8, the last 32 - 25
    assert split_layers(126, 8, False, None) == [7] + [8] * 14 + [7]
    assert split_layers(32, 4, True, None) == [8, 9, 8, 7]
    assert split_layers(126, 8, False, 8) == [7] + [8] * 14 + [7]


def test_torchtitan_split_takes_the_embedding_and_output_weights_and_rounds_stages_up():
    # first/last_stage_less_layers 2 and 0: 32 + 2 effective layers over 4 stages, 8 rest 2
    assert split_layers(32, 4, True, None, 2, 0) == [7, 9, 8, 8]
    # layers_per_stage 5 on 30 layers: ceil(32 / 5) = 7 stages, not a multiple of 4 ranks
    with pytest.raises(InputError, match="layers_per_stage"):
        split_layers(30, 4, False, 5)
    assert split_layers(30, 4, False, 4) == [3] + [4] * 6 + [3]  # 32 / 4 = 8 stages, 2 per rank


def _pp_toml(tmp_path, lines):
    # 16 micro-batches of one per replica: the V shapes need 2 x pp, interleaved a multiple of pp
    text = (DATA / "torchtitan-llama3_405b.toml").read_text().replace("pipeline_parallel_degree = 1", lines)
    text = text.replace("batch_size = 2", "batch_size = 16")
    f = tmp_path / "pp.toml"
    f.write_text(text)
    return f


@pytest.mark.parametrize("schedule, expected", [("Interleaved1F1B", "interleaved"), ("ZBVZeroBubble", "zb-v"),
                                                ("DualPipeV", "dualpipe-v")])
def test_torchtitan_multi_stage_schedules_place_two_stages_per_rank_by_default(tmp_path, schedule, expected):
    f = _pp_toml(tmp_path, f'pipeline_parallel_degree = 8\npipeline_parallel_schedule = "{schedule}"')
    imported = import_config("torchtitan", f, {"cluster.node": "dgx-h100", "cluster.nodes": 64})
    plan = imported.scenario["plan"]
    assert plan["schedule"] == expected and plan["pipeline_layout"] == [7] + [8] * 14 + [7]
    assert plan.get("vpp", 1) == (2 if expected == "interleaved" else 1)
    scenario_from_dict(imported.scenario)


def test_torchtitan_pipelines_run_on_torchs_runtime_keeping_no_outputs(tmp_path):
    # torch.distributed.pipelining; trainer.py calls step(return_outputs=False) (pipebuffers.py)
    f = _pp_toml(tmp_path, 'pipeline_parallel_degree = 8\npipeline_parallel_schedule = "1F1B"')
    imported = import_config("torchtitan", f, {"cluster.node": "dgx-h100", "cluster.nodes": 64})
    assert (imported.scenario["plan"]["pp_impl"], imported.scenario["plan"]["pp_outputs"]) == ("torch", "in-flight")
    # releases before v0.2.1 kept the last stage's outputs; the config does not say its release
    assert any(m["key"] == "torchtitan release" and "pp_outputs=last-stage" in m["why"] for m in imported.unmapped)
    plain = import_config("torchtitan", DATA / "torchtitan-llama3_405b.toml", {"cluster.node": "dgx-h100"})
    assert "pp_impl" not in plain.scenario["plan"]


def test_torchtitan_pipelines_add_each_micro_batchs_gradients_into_the_unsharded_ones(tmp_path):
    # torch.distributed.pipelining runs every backward without gradient sync (stage.py
    # backward_maybe_with_nosync); without pipelining FSDP2 reduces each micro-batch's gradients
    f = _pp_toml(tmp_path, 'pipeline_parallel_degree = 8\npipeline_parallel_schedule = "1F1B"')
    piped = import_config("torchtitan", f, {"cluster.node": "dgx-h100", "cluster.nodes": 64})
    plain = import_config("torchtitan", DATA / "torchtitan-llama3_405b.toml", {"cluster.node": "dgx-h100"})
    assert piped.scenario["plan"]["grad_accumulation_fusion"] is False
    assert "grad_accumulation_fusion" not in plain.scenario["plan"]


def test_torchtitan_split_points_give_the_layout(tmp_path):
    points = ", ".join(f'"layers.{n}"' for n in range(8, 126, 8))  # 15 cuts: 16 stages of 8, the last 6
    f = _pp_toml(tmp_path, f'pipeline_parallel_degree = 8\npipeline_parallel_schedule = "Interleaved1F1B"\n'
                           f"pipeline_parallel_split_points = [{points}]")
    plan = import_config("torchtitan", f, {"cluster.node": "dgx-h100", "cluster.nodes": 64}).scenario["plan"]
    assert plan["pipeline_layout"] == [8] * 15 + [6] and plan["vpp"] == 2


def test_torchtitan_model_parts_give_the_layout(tmp_path):
    parts = [["tok_embeddings"] + [f"layers.{i}" for i in range(62)]] + \
        [[f"layers.{i}" for i in range(62, 126)] + ["norm", "output"]]
    toml = "module_fqns_per_model_part = [" + ", ".join("[" + ", ".join(f'"{n}"' for n in p) + "]" for p in parts) + "]"
    f = _pp_toml(tmp_path, "pipeline_parallel_degree = 2\n" + toml)
    plan = import_config("torchtitan", f, {"cluster.node": "dgx-h100", "cluster.nodes": 16}).scenario["plan"]
    assert plan["pipeline_layout"] == [62, 64]


def test_torchtitan_split_whose_middle_ranks_differ_is_kept_as_split(tmp_path):
    text = (DATA / "torchtitan-llama3_8b.toml").read_text().replace(
        "pipeline_parallel_degree = 1", "pipeline_parallel_degree = 4")
    f = tmp_path / "pp4.toml"
    f.write_text(text)
    imported = import_config("torchtitan", f, {"cluster.node": "dgx-h100", "cluster.nodes": 1})
    assert imported.scenario["plan"]["pipeline_layout"] == [8, 9, 8, 7]
    layout = compile_scenario(scenario_from_dict(imported.scenario))
    assert [layout.representative(i).layers for i in range(4)] == [8, 9, 8, 7]


def test_torchtitan_layers_per_stage_that_leaves_a_remainder_is_refused(tmp_path):
    f = _pp_toml(tmp_path, 'pipeline_parallel_degree = 8\npipeline_parallel_schedule = "Interleaved1F1B"\n'
                           "pipeline_parallel_layers_per_stage = 5")
    with pytest.raises(InputError, match="layers_per_stage"):
        import_config("torchtitan", f, {"cluster.node": "dgx-h100", "cluster.nodes": 64})


def test_torchtitan_single_stage_schedule_with_two_stages_per_rank_is_refused(tmp_path):
    f = _pp_toml(tmp_path, 'pipeline_parallel_degree = 8\npipeline_parallel_schedule = "1F1B"\n'
                           "pipeline_parallel_layers_per_stage = 8")
    with pytest.raises(InputError, match="layers_per_stage"):
        import_config("torchtitan", f, {"cluster.node": "dgx-h100", "cluster.nodes": 64})


def test_torchtitan_unknown_reshard_policy_is_refused(tmp_path):
    text = (DATA / "torchtitan-llama3_70b.toml").read_text().replace(
        "[parallelism]\n", '[parallelism]\nfsdp_reshard_after_forward = "sometimes"\n')
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(InputError, match="fsdp_reshard_after_forward"):
        import_config("torchtitan", f, {"cluster.node": "dgx-h100"})


def test_torchtitan_models_run_separate_projection_linears():
    # torchtitan's Llama: wq, wk, wv and w1, w3 are separate nn.Linear; Megatron fuses them
    imported = import_config("torchtitan", DATA / "torchtitan-llama3_8b.toml", {"cluster.node": "dgx-h100"})
    assert imported.scenario["plan"]["projections"] == "separate"
    nemo = import_config("megatron", DATA / "nemo-llama3.1_70b.yaml", {"cluster.node": "dgx-h100"})
    assert "projections" not in nemo.scenario["plan"]  # fused, the default


def test_torchtitan_with_tp_computes_the_loss_under_loss_parallel_unless_disabled(tmp_path):
    text = (DATA / "torchtitan-llama3_405b.toml").read_text()
    imported = import_config("torchtitan", DATA / "torchtitan-llama3_405b.toml", {"cluster.node": "dgx-h100"})
    assert imported.scenario["plan"]["loss"] == "loss-parallel"
    disabled = tmp_path / "no-loss-parallel.toml"
    disabled.write_text(text.replace("[parallelism]", "[parallelism]\ndisable_loss_parallel = true"))
    assert import_config("torchtitan", disabled, {"cluster.node": "dgx-h100"}).scenario["plan"]["loss"] == "unfused"
    fsdp = import_config("torchtitan", DATA / "torchtitan-llama3_8b.toml", {"cluster.node": "dgx-h100"})
    assert "loss" not in fsdp.scenario["plan"]  # no TP group: the plain cross-entropy (unfused, the default)


def test_torchtitan_hsdp_is_zero_3_over_each_replica(tmp_path):
    text = (DATA / "torchtitan-llama3_8b.toml").read_text()
    hsdp = tmp_path / "hsdp.toml"
    hsdp.write_text(text.replace("data_parallel_replicate_degree = 1", "data_parallel_replicate_degree = 2")
                    .replace("data_parallel_shard_degree = -1", "data_parallel_shard_degree = 8"))
    imported = import_config("torchtitan", hsdp, {"cluster.node": "dgx-h100", "cluster.nodes": 2})
    assert _plan(imported, "dp", "dp_replicate", "zero_stage") == {"dp": 16, "dp_replicate": 2, "zero_stage": 3}
    scenario_from_dict(imported.resolve(imported.scenario, set()))


@pytest.mark.parametrize("converters,precision", [([], "bf16"), (["quantize.linear.float8"], "fp8")])
def test_torchtitan_float8_converter_of_its_quantize_api_is_fp8(tmp_path, converters, precision):
    """torchtitan renamed the converter and its section quantize.linear.float8 (8a2686c4a); the
    config of Feb 2026 filters the lm_head (`output`), which llmsim keeps in BF16 anyway."""
    text = (DATA / "torchtitan-llama3_8b-202602.toml").read_text().replace(
        '# converters = ["float8"]', f"converters = {json.dumps(converters)}")
    (tmp_path / "c.toml").write_text(text)
    imported = import_config("torchtitan", tmp_path / "c.toml", {"cluster.node": "dgx-h100"})
    assert _plan(imported, "precision", "recompute") == {"precision": precision, "recompute": "op-selective"}
    assert "quantize.linear.float8.filter_fqns" not in {u["key"] for u in imported.unmapped}
    if converters:
        assert imported.scenario["plan"]["fp8_recipe"] == "tensorwise"


def test_torchtitan_mx_converters_are_refused(tmp_path):
    text = (DATA / "torchtitan-llama3_8b-202602.toml").read_text().replace(
        '# converters = ["float8"]', 'converters = ["quantize.linear.mx"]')
    (tmp_path / "c.toml").write_text(text)
    with pytest.raises(InputError, match="quantize.linear.mx"):
        import_config("torchtitan", tmp_path / "c.toml", {"cluster.node": "dgx-h100"})


def test_torchtitan_layerwise_recompute_is_refused(tmp_path):
    text = (DATA / "torchtitan-llama3_8b.toml").read_text()
    layerwise = tmp_path / "ac.toml"
    layerwise.write_text(text.replace("selective_ac_option = 'op'", "selective_ac_option = '2'"))
    with pytest.raises(InputError, match="selective_ac_option"):
        import_config("torchtitan", layerwise, {"cluster.node": "dgx-a100"})


# Rows of shared/validation/nemo-dgxc-h100.csv, read by hand from the same runs' configs (ids there).
NEMO_ROWS = {
    "nemo-llama3.1_8b.yaml": ("dgxc-llama31-8b-bf16-8gpu", dict(
        layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256, seq_len=8192, activation="swiglu",
        tied_embeddings=False, dropout=False, tp=1, pp=1, cp=2, vpp=1, schedule="1f1b", micro_batch=1, global_batch=128,
        sequence_parallel=False, recompute="none", zero_stage=1, precision="bf16", tp_comm_overlap=False,
        dp_overlap=True, grad_precision="bf16", fp8_params=False, master_weights="remainders", nodes=1, dp=4)),
    "nemo-llama3.1_70b.yaml": ("dgxc-llama31-70b-bf16-64gpu", dict(
        layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128512, seq_len=8192, activation="swiglu",
        tied_embeddings=False, dropout=False, tp=4, pp=4, cp=2, vpp=5, schedule="interleaved", micro_batch=1,
        global_batch=128,
        sequence_parallel=True, recompute="none", zero_stage=1, precision="bf16", tp_comm_overlap=True,
        dp_overlap=True, grad_precision="bf16", fp8_params=False, master_weights="remainders", nodes=8, dp=2)),
    "nemo-gpt3_175b_hydra.yaml": ("dgxc-gpt3-175b-fp8-128gpu", dict(
        layers=96, hidden=12288, heads=96, kv_heads=96, ffn_hidden=49152, vocab=50688, seq_len=2048, activation="gelu",
        tied_embeddings=True, dropout=True, tp=4, pp=8, cp=1, vpp=12, schedule="interleaved", micro_batch=1,
        global_batch=256,
        sequence_parallel=True, recompute="none", zero_stage=1, precision="fp8", tp_comm_overlap=True,
        dp_overlap=True, grad_precision="bf16", fp8_params=True, master_weights=None, nodes=16, dp=4)),
}


def test_pipeline_sends_are_whole_under_megatron_core_and_legacy_megatron_without_scatter_gather():
    nemo = import_config("megatron", DATA / "nemo-llama3.1_70b.yaml", {"cluster.node": "dgx-h100"})
    assert nemo.scenario["plan"]["pp_scatter_gather"] is False  # split only by sequence parallelism
    legacy = import_config("megatron", None, {"cluster.node": "dgx-a100"}, argv=[
        "--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048",
        "--max-position-embeddings", "2048", "--micro-batch-size", "1", "--global-batch-size", "64",
        "--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--fp16",
        "--no-scatter-gather-tensors-in-pipeline"])
    assert legacy.scenario["plan"]["pp_scatter_gather"] is False


@pytest.mark.parametrize("name", sorted(NEMO_ROWS))
def test_nemo_configs_import_as_the_validation_rows_of_the_same_runs(name):
    """The 70B launcher yaml is for 8 nodes, as the 64-GPU row; the 8B one for 1 node."""
    _, want = NEMO_ROWS[name]
    imported = import_config("megatron", DATA / name, {"cluster.node": "dgx-h100"})
    s = scenario_from_dict(imported.scenario)
    got = {**{k: getattr(s.model, k) for k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab",
                                                 "seq_len", "activation", "tied_embeddings", "dropout")},
           **{k: getattr(s.plan, k) for k in ("tp", "pp", "cp", "vpp", "schedule", "micro_batch", "global_batch",
                                                "sequence_parallel", "recompute", "zero_stage", "precision",
                                                "tp_comm_overlap", "dp_overlap", "grad_precision", "fp8_params",
                                                "master_weights", "dp")},
           "nodes": s.cluster.nodes}
    assert got == want
    keys = set(flatten(yaml.safe_load((DATA / name).read_text())))
    assert keys <= set(_accounted(imported))


def test_megatron_2021_gpt3_script_imports_as_the_readme_row_of_the_same_run():
    """Megatron-LM's own GPT-3 175B example of Jan 2021 (its arguments in a shell variable run
    through `sh -c`; --checkpoint-activations; dropout at Megatron's 0.1 default; no flash
    attention then) is the README's published run, whose row was written by hand. Its commit
    predates the scatter/gather of pipeline sends and the fused weight-gradient accumulation,
    which the script cannot say: the import notes both, and told so gives the row's plan and
    prediction."""
    from simulator.validation.runs import load_runs
    imported = import_config("megatron", DATA / "megatron-pretrain_gpt3_175B-2021.sh",
                             {"cluster.node": "dgx-a100", "cluster.nodes": 128})
    assert {"no-scatter-gather-tensors-in-pipeline", "no-gradient-accumulation-fusion"} <= {
        u["key"] for u in imported.unmapped}
    ours = scenario_from_dict({**imported.scenario, "plan": {**imported.scenario["plan"], "pp_scatter_gather": False,
                                                             "grad_accumulation_fusion": False}})
    published = next(r for r in load_runs() if r.id == "megatron_readme_gpt3_175B_1024gpu").build()
    assert (ours.plan.recompute, ours.plan.flash_attention, ours.model.dropout) == ("full", False, True)
    assert ours.plan == published.plan and dataclasses.replace(ours.model, name=published.model.name) == published.model


@pytest.mark.parametrize("args, recompute, method, layers", [
    (["--checkpoint-activations"], "full", "uniform", 1),  # Megatron-LM 2021: every layer
    (["--checkpoint-activations", "--checkpoint-num-layers", "2"], "full", "uniform", 2),
    (["--checkpoint-activations", "--activations-checkpoint-method", "block",  # Aug 2021 - 2022
      "--activations-checkpoint-num-layers", "4"], "full", "block", 4),
    (["--activations-checkpoint-method", "uniform"], "full", "uniform", 1),
    (["--recompute-activations"], "selective", None, None)])
def test_megatron_recompute_arguments_of_each_era(args, recompute, method, layers):
    plan = import_config("megatron", None, {"cluster.node": "dgx-a100"}, argv=[*MEGATRON_ARGV, *args]).scenario["plan"]
    assert (plan["recompute"], plan.get("recompute_method"), plan.get("recompute_num_layers")) == \
        (recompute, method, layers)


@pytest.mark.parametrize("args, dropout", [([], True), (["--attention-dropout", "0.0", "--hidden-dropout", "0"], False),
                                           (["--attention-dropout", "0.05"], True)])
def test_megatron_dropout_is_its_attention_and_hidden_rates_default_0_1(args, dropout):
    imported = import_config("megatron", None, {"cluster.node": "dgx-a100"}, argv=[*MEGATRON_ARGV, *args])
    model = imported.scenario["model"]
    assert model["dropout"] is dropout


@pytest.mark.parametrize("args, grads", [
    (["--fp16"], "fp16"),  # the parameters' own .grad, all-reduced as they are
    (["--fp16", "--accumulate-allreduce-grads-in-fp32"], "fp32"),
    (["--fp16", "--fp32-allreduce"], "fp32"),  # 2021
    (["--bf16"], "fp32"),  # Megatron-LM forces fp32 accumulation for bf16
    (["--bf16", "--grad-reduce-in-bf16"], "bf16")])
def test_megatron_gradient_precision_follows_megatrons_defaults(args, grads):
    argv = [a for a in MEGATRON_ARGV if a != "--bf16"] + args
    plan = import_config("megatron", None, {"cluster.node": "dgx-a100"}, argv=argv).scenario["plan"]
    assert plan["grad_precision"] == grads


def test_megatron_fp32_residual_stream_is_noted_as_not_modelled():
    imported = import_config("megatron", None, {"cluster.node": "dgx-a100"},
                             argv=[*MEGATRON_ARGV, "--fp32-residual-connection"])
    assert [u["key"] for u in imported.unmapped] == ["fp32-residual-connection"]


def test_megatron_dropout_on_the_attention_alone_is_refused():
    with pytest.raises(InputError, match="megatron hidden-dropout"):
        import_config("megatron", None, {"cluster.node": "dgx-a100"}, argv=[*MEGATRON_ARGV, "--hidden-dropout", "0"])


def test_nemo_o1_keeps_fp32_parameters_as_the_master_copy(tmp_path):
    # megatron_amp_O2 false: the module in fp32 under autocast, its parameters the optimizer's
    # master copy (NeMo megatron_base_model.py: model_dtype fp32, store_params false)
    data = yaml.safe_load((DATA / "nemo-llama3.1_8b.yaml").read_text())
    data["model"]["megatron_amp_O2"] = False
    (tmp_path / "o1.yaml").write_text(yaml.safe_dump(data))
    o1 = import_config("megatron", tmp_path / "o1.yaml", {"cluster.node": "dgx-h100"}).scenario["plan"]
    o2 = import_config("megatron", DATA / "nemo-llama3.1_8b.yaml", {"cluster.node": "dgx-h100"}).scenario["plan"]
    assert o1["fp32_params"] is True and "fp32_params" not in o2


@pytest.mark.parametrize("key, value", [("num_micro_batches_with_partial_activation_checkpoints", 4),
                                        ("activations_checkpoint_layers_per_pipeline", 2)])
def test_nemo_partial_activation_checkpointing_is_refused(tmp_path, key, value):
    data = yaml.safe_load((DATA / "nemo-llama3.1_70b.yaml").read_text())
    data["model"][key] = value
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match=f"nemo model.{key}"):
        import_config("megatron", tmp_path / "p.yaml", {"cluster.node": "dgx-h100"})


def test_megatron_and_nemo_imports_run_megatrons_vocab_parallel_cross_entropy():
    nemo = import_config("megatron", DATA / "nemo-llama3.1_70b.yaml", {"cluster.node": "dgx-h100"})
    script = import_config("megatron", DATA / "megatron-train_gpt3_175b_distributed.sh",
                           {"cluster.node": "dgx-a100", "cluster.nodes": 128})
    assert nemo.scenario["plan"]["loss"] == script.scenario["plan"]["loss"] == "vocab-parallel"


MOE_ARGV = ["--num-layers", "61", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "2048",
            "--global-batch-size", "64", "--vocab-size", "32000", "--num-experts", "8"]
MEGATRON_ARGV = ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048",
                 "--max-position-embeddings", "2048", "--micro-batch-size", "1", "--global-batch-size", "64",
                 "--tensor-model-parallel-size", "2", "--bf16", "--use-distributed-optimizer"]


@pytest.mark.parametrize("comm,method", [("p2p", "ring"), ("all_gather", "kv-allgather"), ("a2a", "ulysses")])
def test_megatron_cp_comm_types_are_transformer_engines_cp_attention(comm, method):
    plan = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[
        *MEGATRON_ARGV, "--context-parallel-size", "2", "--cp-comm-type", comm]).scenario["plan"]
    assert plan["cp_attention"] == method


def test_megatron_hierarchical_cp_is_ulysses_inside_groups_of_the_first_size_and_a_ring_over_them():
    plan = import_config("megatron", None, {"cluster.node": "dgx-h100", "cluster.nodes": 2}, argv=[
        *MEGATRON_ARGV, "--context-parallel-size", "8", "--cp-comm-type", "a2a+p2p",
        "--hierarchical-context-parallel-sizes", "2", "4"]).scenario["plan"]
    assert (plan["cp_attention"], plan["cp_ulysses"]) == ("ulysses-ring", 2)
    with pytest.raises(InputError, match="hierarchical-context-parallel-sizes"):
        import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[
            *MEGATRON_ARGV, "--context-parallel-size", "2", "--cp-comm-type", "a2a+p2p"])


def test_megatron_distributed_optimizer_instances_are_hybrid_sharding():
    plan = import_config("megatron", None, {"cluster.node": "dgx-h100", "cluster.nodes": 2}, argv=[
        *MEGATRON_ARGV, "--num-distributed-optimizer-instances", "2"]).scenario["plan"]
    assert (plan["zero_stage"], plan["dp_replicate"]) == (1, 2)


def test_megatron_fp8_param_gather_is_fp8_primary_weights():
    """--fp8-param-gather keeps the compute parameters in FP8 and all-gathers them in FP8
    (Megatron-LM megatron/training/arguments.py _add_transformer_engine_args)."""
    plan = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[
        *MEGATRON_ARGV, "--fp8-format", "hybrid", "--fp8-param-gather"]).scenario["plan"]
    assert (plan["precision"], plan["fp8_params"]) == ("fp8", True)


def test_megatron_fp8_recipes_map_to_te_delayed_current_and_mxfp8_and_blockwise_is_refused():
    def plan(recipe):
        return import_config("megatron", None, {"cluster.node": "dgx-b200"}, argv=[
            *MEGATRON_ARGV, "--fp8-format", "e4m3", "--fp8-recipe", recipe]).scenario["plan"]
    assert (plan("delayed")["precision"], plan("delayed")["fp8_recipe"]) == ("fp8", "delayed")
    assert (plan("tensorwise")["precision"], plan("tensorwise")["fp8_recipe"]) == ("fp8", "current")
    assert plan("mxfp8")["precision"] == "mxfp8"
    with pytest.raises(InputError, match="fp8-recipe"):
        plan("blockwise")


def test_megatron_router_padding_for_quantization_is_plan_moe_router_padding():
    plan = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[
        *MOE_ARGV, "--micro-batch-size", "1", "--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "tensorwise",
        "--moe-router-padding-for-quantization"]).scenario["plan"]
    assert plan["moe"]["router_padding"] is True


def test_nemo_squared_relu_is_refused():
    with pytest.raises(InputError, match="model.activation"):
        import_config("megatron", DATA / "nemo-nemotron4-15b-synth.yaml", {"cluster.node": "dgx-h100"})


def test_megatron_launch_script_gives_gpt3_175b():
    imported = import_config("megatron", DATA / "megatron-train_gpt3_175b_distributed.sh",
                             {"cluster.node": "dgx-a100", "cluster.nodes": 128})
    s = scenario_from_dict(imported.scenario)
    assert (s.model.layers, s.model.hidden, s.model.heads, s.model.ffn_hidden, s.model.seq_len) == (
        96, 12288, 96, 4 * 12288, 2048)
    assert s.model.vocab == 51200  # GPT-2's 50257 padded to a multiple of 128 x TP 8
    assert (s.plan.tp, s.plan.pp, s.plan.dp, s.plan.micro_batch, s.plan.global_batch, s.plan.precision) == (
        8, 16, 8, 1, 1536, "fp16")
    assert not s.plan.dp_overlap and s.plan.zero_stage == 0  # Megatron defaults without the flags
    assert "rampup-batch-size" in [m["key"] for m in imported.unmapped]
    assert {"lr", "save", "data-path"} <= {m["key"] for m in imported.ignored}


def test_megatron_arguments_and_their_refusals():
    args = ["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32", "--group-query-attention",
            "--num-query-groups", "8", "--swiglu", "--seq-length", "4096", "--micro-batch-size", "2",
            "--global-batch-size", "64", "--bf16", "--vocab-size", "32000", "--use-distributed-optimizer"]
    imported = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=args)
    s = scenario_from_dict(imported.scenario)
    assert (s.model.kv_heads, s.model.ffn_hidden, s.model.vocab) == (8, 10880, 32000)  # int(8*4096/3/64)*64
    assert (s.plan.zero_stage, s.plan.precision, s.plan.global_batch) == (1, "bf16", 64)
    block = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=args + [
        "--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "2"])
    assert _plan(block, "recompute", "recompute_method", "recompute_num_layers") == {
        "recompute": "full", "recompute_method": "block", "recompute_num_layers": 2}
    modules = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=args + [
        "--recompute-granularity", "selective", "--recompute-modules", "mlp", "core_attn"])
    assert _plan(modules, "recompute", "recompute_modules") == {"recompute": "selective",
                                                                 "recompute_modules": ["core_attn", "mlp"]}
    with pytest.raises(InputError, match="recompute-modules.*mhc not modelled"):
        import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=args + [
            "--recompute-granularity", "selective", "--recompute-modules", "mhc"])
    moe = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=args + [
        "--num-experts", "8", "--moe-layer-recompute"])  # deprecated: selective with the moe module
    assert _plan(moe, "recompute", "recompute_modules") == {"recompute": "selective",
                                                             "recompute_modules": ["core_attn", "moe"]}
    flex = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=args + [
        "--num-experts", "8", "--moe-token-dispatcher-type", "flex"])  # DeepEP: Megatron-Core's default backend
    assert flex.scenario["plan"]["moe"]["dispatcher"] == "deepep"
    hybrid = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=args + [
        "--num-experts", "8", "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep"])
    assert hybrid.scenario["plan"]["moe"]["dispatcher"] == "hybridep"
    sms = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=args + [
        "--num-experts", "8", "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-num-sms", "24"])
    assert sms.scenario["plan"]["moe"]["dispatcher_sms"] == 24
    with pytest.raises(InputError, match="moe-flex-dispatcher-backend.*NCCL EP"):
        import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=args + [
            "--num-experts", "8", "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "ncclep"])
    with pytest.raises(InputError, match="moe-enable-deepep.*flex"):
        import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=args + [
            "--num-experts", "8", "--moe-token-dispatcher-type", "alltoall", "--moe-enable-deepep"])


def test_megatron_precision_aware_optimizer_with_bf16_moments():
    argv = [*MEGATRON_ARGV, "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    plan = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=argv).scenario["plan"]
    assert (plan["optimizer_precision"], plan["grad_precision"]) == ("bf16-moments", "fp32")
    plan = import_config("megatron", None, {"cluster.node": "dgx-h100"},
                         argv=argv + ["--main-grads-dtype", "bf16"]).scenario["plan"]
    assert plan["grad_precision"] == "bf16"
    with pytest.raises(InputError, match="use-precision-aware-optimizer"):  # fp8 moments: not modelled
        import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[
            *MEGATRON_ARGV, "--use-precision-aware-optimizer", "--exp-avg-dtype", "fp8"])


@pytest.mark.parametrize("change, optimizer_precision, master_weights", [
    ({}, "fp32", "remainders"),  # fp32 states beside bf16 weights: the int16 remainders
    ({"optim": {"dtype": "bf16"}}, "bf16", "none"),  # states in the weights' dtype: no copy
    ({"fp8": True, "fp8_params": True}, "fp32", None),  # FP8 primary weights: a whole copy
    ({"optim": {"store_params": True}}, "fp32", None),
    ({"optim": {"store_params": False, "store_param_remainders": True}}, "fp32", "remainders"),
    ({"megatron_amp_O2": False}, "fp32", None),  # fp32 parameters, the master themselves
])
def test_nemo_distributed_fused_adam_keeps_its_master_copy_as_nemo_picks(tmp_path, change, optimizer_precision,
                                                                          master_weights):
    """NVIDIA/NeMo@8cfedd7203 megatron_base_model.py setup_optimization (as in 24.09)."""
    data = yaml.safe_load((DATA / "nemo-llama3.1_8b.yaml").read_text())
    for key, value in change.items():
        data["model"][key] = {**data["model"][key], **value} if isinstance(value, dict) else value
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(data))
    imported = import_config("megatron", tmp_path / "n.yaml", {"cluster.node": "dgx-h100"})
    plan = scenario_from_dict(imported.scenario).plan
    assert (plan.optimizer_precision, plan.master_weights) == (optimizer_precision, master_weights)


@pytest.mark.parametrize("extra, master_weights", [
    ([], "remainders"),  # TransformerEngine's FusedAdam keeps the main parameters of the bf16 weights
    (["--fp8-format", "hybrid"], "remainders"),  # the delayed recipe: still TransformerEngine's
    (["--fp8-format", "hybrid", "--fp8-param-gather"], None),  # FP8 primary weights
    (["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"], None),  # Megatron-Core keeps fp32 main params
])
def test_megatron_precision_aware_optimizer_keeps_remainders_where_transformer_engine_holds_the_master(
        extra, master_weights):
    argv = [*MEGATRON_ARGV, "--use-precision-aware-optimizer", *extra]
    plan = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=argv).scenario["plan"]
    assert plan.get("master_weights") == master_weights


@pytest.mark.parametrize("remainders, master_weights", [(True, "remainders"), (False, None)])
def test_megatron_bridge_reads_store_param_remainders_under_the_precision_aware_optimizer(tmp_path, remainders,
                                                                                        master_weights):
    data = yaml.safe_load((DATA / "bridge-llama3_8b_sft_gb200_fp8_mx_v1.yaml").read_text())
    data["mixed_precision"].update(fp8=None, fp8_param=False, fp8_param_gather=False)  # bf16
    data["optimizer"].update(use_precision_aware_optimizer=True, store_param_remainders=remainders)
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(data))
    plan = import_config("megatron", tmp_path / "b.yaml", {"cluster.node": "dgx-b200"}).scenario["plan"]
    assert plan.get("master_weights") == master_weights


def test_a_flag_given_twice_with_different_values_is_refused_only_where_it_is_read():
    """Megatron-LM's llama3 example gives --tokenizer-type in both branches of an `if`; with
    --vocab-size given the tokenizer does not matter."""
    script = import_config("megatron", DATA / "megatron-train_llama3_8b_h100_fp8.sh", {"cluster.node": "dgx-h100"})
    assert (script.scenario["model"]["vocab"], script.scenario["plan"]["precision"]) == (128256, "fp8")
    twice = ["--tokenizer-type", "NullTokenizer", "--tokenizer-type", "HuggingFaceTokenizer"]
    with pytest.raises(InputError, match="tokenizer-type.*more than once"):
        import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=MEGATRON_ARGV + twice)
    same = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=MEGATRON_ARGV + ["--bf16"])
    assert same.scenario["plan"]["precision"] == "bf16"


def test_megatron_mixtral_script_is_mixtral_8x7b_with_expert_parallelism():
    """Parameters by hand: embedding and lm_head 2 x 32000 x 4096; per layer attention
    2 x 4096^2 + 2 x 4096 x 1024, 8 experts x 3 x 4096 x 14336, router 4096 x 8, two RMSNorms;
    active: 2 of the 8 experts."""
    imported = import_config("megatron", DATA / "megatron-train_mixtral_8x7b_distributed.sh",
                             {"cluster.node": "dgx-h100", "cluster.nodes": 8})
    s = scenario_from_dict(imported.scenario)
    m = s.model
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.vocab, m.seq_len, m.activation) == (
        32, 4096, 32, 8, 32000, 4096, "swiglu")
    assert (m.experts, m.top_k, m.expert_ffn_hidden, m.shared_experts, m.dense_layers) == (8, 2, 14336, 0, 0)
    assert (s.plan.tp, s.plan.pp, s.plan.ep, s.plan.etp, s.plan.moe.dispatcher) == (1, 4, 8, 1, "alltoall")
    assert s.plan.moe.grouped_gemm  # the script's --moe-grouped-gemm
    layer = 2 * 4096 ** 2 + 2 * 4096 * 1024 + 4096 * 8 + 2 * 4096
    assert m.params() == 32 * (layer + 8 * 3 * 4096 * 14336) + 2 * 32000 * 4096 + 4096
    assert m.active_params() == 32 * (layer + 2 * 3 * 4096 * 14336) + 2 * 32000 * 4096 + 4096


def test_megatron_deepseek_v3_arguments_give_the_model_of_its_config_json():
    """Megatron-LM's DeepSeek-V3 script (MLA, 256 experts top-8 with a shared expert, 3 dense
    layers by a layer pattern, one MTP module) against DeepSeek-V3's released config.json. The
    script runs the flex dispatcher with Hybrid-EP; its group-limited routing (8 groups, top 4)
    is the config.json's n_group and topk_group."""
    path = DATA / "megatron-sbatch_mfsdp_deepseek_v3.sh"
    imported = import_config("megatron", path, {"cluster.node": "dgx-h100", "cluster.nodes": 32})
    s = scenario_from_dict(imported.scenario)
    hf = scenario_from_dict({"model": {"hf_config": str(HF / "deepseek-v3.json"), "seq_len": 4096},
                             "cluster": {"node": "dgx-h100"}, "plan": {"global_batch": 8}}).model
    assert dataclasses.replace(s.model, name=hf.name) == hf
    assert s.plan.moe.dispatcher == "hybridep"
    assert (s.plan.ep, s.plan.etp, s.plan.zero_stage, s.plan.zero3_impl, s.plan.grad_precision) == (
        8, 1, 3, "fsdp2", "bf16")  # Megatron-FSDP optim_grads_params, main grads and their reduction in bf16
    assert (s.plan.recompute, s.plan.recompute_modules) == ("selective", ("mlp", "moe", "layernorm", "mla_up_proj"))


def test_megatron_fsdp_shards_by_its_strategy_and_torch_fsdp2_is_zero_3():
    script = import_config("megatron", DATA / "megatron-train_llama3_8b_fsdp_h100_fp8.sh",
                           {"cluster.node": "dgx-h100"})
    assert _plan(script, "zero_stage", "zero3_impl", "grad_precision") == {
        "zero_stage": 3, "zero3_impl": "fsdp2", "grad_precision": "bf16"}
    fsdp = [*MEGATRON_ARGV, "--use-megatron-fsdp", "--data-parallel-sharding-strategy"]
    for strategy, stage in (("no_shard", 0), ("optim", 1), ("optim_grads", 2)):
        imported = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=fsdp + [strategy])
        assert imported.scenario["plan"]["zero_stage"] == stage
    with pytest.raises(InputError, match="megatron-fsdp-grad-comm-dtype"):
        import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=fsdp + [
            "optim_grads_params", "--megatron-fsdp-main-grads-dtype", "fp32", "--megatron-fsdp-grad-comm-dtype",
            "bf16"])
    torch_fsdp = import_config("megatron", None, {"cluster.node": "dgx-h100"},
                               argv=[*MEGATRON_ARGV, "--use-torch-fsdp2"])
    assert _plan(torch_fsdp, "zero_stage", "zero3_impl") == {"zero_stage": 3, "zero3_impl": "fsdp2"}


@pytest.mark.parametrize("pattern,dense,freq,offset", [
    ("([0]*3+[1]*58)", 3, 1, 0), ("[1,0]*30+[1]", 0, 2, 0), ("2", 0, 2, 0),
    ("[0,1]*30+[0]", 0, 2, 1),  # Llama 4 Maverick's [0, 1] * 24, on 61 layers
    ("[0]*5+[1,0,0]*18+[1,0]", 3, 3, 2)])  # MoE on 5, 8, ..., 59: layer 2 of the rule stays dense
def test_megatron_moe_layer_pattern_is_leading_dense_layers_a_frequency_and_an_offset(pattern, dense, freq, offset):
    model = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[
        *MOE_ARGV, "--moe-layer-freq", pattern]).scenario["model"]
    assert (model.get("dense_layers", 0), model["moe_layer_freq"], model.get("moe_layer_offset", 0)) == \
        (dense, freq, offset)


def test_megatron_moe_without_grouped_gemm_runs_one_gemm_per_local_expert():
    # --moe-grouped-gemm is a store_true flag: Megatron-Core's default is SequentialMLP
    imported = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=MOE_ARGV)
    assert imported.scenario["plan"]["moe"]["grouped_gemm"] is False
    grouped = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[*MOE_ARGV, "--moe-grouped-gemm"])
    assert grouped.scenario["plan"]["moe"]["grouped_gemm"] is True


@pytest.mark.parametrize("pattern", ["([1]*3+[0]*58)", "[1]*60", "__import__('os')", "[1]*10**9"])
def test_megatron_moe_layer_pattern_llmsim_cannot_express_is_refused(pattern):
    with pytest.raises(InputError, match="moe-layer-freq"):
        import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[*MOE_ARGV, "--moe-layer-freq", pattern])


@pytest.mark.parametrize("value", ["4", "[0,0,0,1]*6"])
def test_megatron_no_rope_freq_is_each_nth_layer_without_rope(value):
    # TransformerConfig expands --no-rope-freq 4 to [0, 0, 0, 1] * (layers / 4)
    model = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[
        *MEGATRON_ARGV, "--position-embedding-type", "rope", "--normalization", "RMSNorm",
        "--no-rope-freq", value]).scenario["model"]
    assert model["nope_layer_interval"] == 4


def test_megatron_qk_l2_norm_is_a_weightless_norm_and_refused_beside_nope_layers():
    argv = [*MEGATRON_ARGV, "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--qk-l2-norm"]
    model = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=argv).scenario["model"]
    assert (model["qk_norm"], model["qk_norm_kind"]) == (True, "l2")
    with pytest.raises(InputError, match="qk-l2-norm"):
        import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[*argv, "--no-rope-freq", "4"])
    with pytest.raises(InputError, match="no-rope-freq"):
        import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[*MEGATRON_ARGV, "--no-rope-freq", "[1]*24"])
    for value in ("00", "[0,1]*13"):  # a zero frequency; a pattern of 26 layers for 24
        with pytest.raises(InputError, match="no-rope-freq"):
            import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[*MEGATRON_ARGV, "--no-rope-freq", value])


def test_megatron_kv_channels_is_the_head_width():
    """Qwen3-30B-A3B: hidden 2048 over 32 heads of 128 (its config.json head_dim)."""
    model = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[
        "--num-layers", "48", "--hidden-size", "2048", "--num-attention-heads", "32", "--kv-channels", "128",
        "--seq-length", "4096", "--global-batch-size", "64", "--vocab-size", "151936"]).scenario["model"]
    assert model["head_dim"] == 128


def test_nemo_grok1_yaml_imports_as_the_grok_rows_of_the_same_runs():
    """moe-runs.csv, dgxc2411-h100-grok1-314b-bf16-512gpu: the yaml is for its 64 nodes. Experts
    are split over TP in Megatron-Core 0.9 (etp = tp = 4); capacity factor 1 with padding. The
    yaml's ub_tp_comm_overlap is false; configure.sh turns it on for the runs."""
    imported = import_config("megatron", DATA / "nemo-grok1_314b.yaml", {"cluster.node": "dgx-h100"})
    s = scenario_from_dict(imported.scenario)
    m, p = s.model, s.plan
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.vocab, m.seq_len, m.activation) == (
        64, 6144, 48, 8, 128, 128512, 8192, "geglu")
    assert (m.experts, m.top_k, m.expert_ffn_hidden, m.shared_experts, m.dense_layers, m.moe_layer_freq) == (
        8, 2, 32768, 0, 0, 1)
    assert (p.tp, p.pp, p.vpp, p.dp, p.cp, p.ep, p.etp, p.micro_batch, p.global_batch, p.recompute, p.precision) == (
        4, 8, 8, 8, 2, 8, 4, 1, 1024, "none", "bf16")
    assert (p.moe.dispatcher, p.moe.capacity_factor, p.moe.pad_to_capacity, p.moe.grouped_gemm) == (
        "alltoall", 1.0, True, False)
    assert s.cluster.devices == 512
    folding = [u for u in imported.unmapped if u["key"] == "model.expert_tensor_parallel_size"]
    assert "plan.moe.folding=false" in folding[0]["why"]  # MCore 0.9 did not fold; the yaml does not say
    keys = set(flatten(yaml.safe_load((DATA / "nemo-grok1_314b.yaml").read_text())))
    assert keys <= set(_accounted(imported))


def test_deepspeed_zero_infinity_offloads_to_nvme():
    imported = import_config("deepspeed", DATA / "deepspeed-ds_zero_stage_infinity_config.json",
                             {"model.preset": "megatron-gpt-7.5b", "cluster.node": "dgx-a100"})
    assert _plan(imported, "zero_stage", "micro_batch", "global_batch", "precision", "grad_precision") == {
        "zero_stage": 3, "micro_batch": 4, "global_batch": 4 * 1 * 8, "precision": "fp16", "grad_precision": "fp16"}
    assert imported.scenario["plan"]["offload"] == {"optimizer": "nvme", "params": "nvme"}
    assert imported.scenario["plan"]["zero3_impl"] == "deepspeed"  # no FSDP2 root kept gathered
    assert "aio.block_size" in [m["key"] for m in imported.unmapped]
    scenario_from_dict(imported.scenario)


def test_deepspeed_legacy_cpu_offload_and_batch_from_the_total():
    imported = import_config("deepspeed", DATA / "deepspeed-ds_zero2_cpu_offload_config.json",
                             {"model.preset": "megatron-gpt-1.7b", "cluster.node": "dgx-a100"})
    assert _plan(imported, "zero_stage", "micro_batch", "global_batch") == {
        "zero_stage": 2, "micro_batch": 2, "global_batch": 16}  # 16 / (1 x 8)
    assert imported.scenario["plan"]["offload"] == {"optimizer": "cpu"}
    keys = set(flatten(json.loads((DATA / "deepspeed-ds_zero2_cpu_offload_config.json").read_text())))
    assert keys <= set(_accounted(imported))


def test_deepspeed_mics_is_refused_for_its_once_per_step_replica_sync(tmp_path):
    f = tmp_path / "mics.json"
    f.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "train_batch_size": 16,
                             "zero_optimization": {"stage": 3, "mics_shard_size": 8}}))
    with pytest.raises(InputError, match="mics_shard_size"):
        import_config("deepspeed", f, {"model.preset": "megatron-gpt-1.7b", "cluster.node": "dgx-a100"})


def test_deepspeed_auto_values_are_refused(tmp_path):
    f = tmp_path / "auto.json"
    f.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}))
    with pytest.raises(InputError, match="auto"):
        import_config("deepspeed", f, {"model.preset": "megatron-gpt-1.7b", "cluster.node": "dgx-a100"})


def _deepspeed(tmp_path, **config):
    f = tmp_path / "ds.json"
    f.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "train_batch_size": 16, **config}))
    return import_config("deepspeed", f, {"model.preset": "megatron-gpt-1.7b", "cluster.node": "dgx-a100"})


@pytest.mark.parametrize("config, plan", [
    # without ZeRO the engine all-reduces the model dtype's gradients after the backward pass
    ({"fp16": {"enabled": True}}, (0, "fp16", False)),
    ({}, (0, "fp32", False)),
    # bf16 without ZeRO accumulates in fp32: the BF16_Optimizer, ZeRO-1 in all but name
    ({"bf16": {"enabled": True}}, (1, "fp32", False)),
    ({"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "fp32"}},
     (1, "fp32", False)),
    # ZeRO reduces the model dtype's gradients, overlapped by overlap_comm: on by default for stage 3 only
    ({"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}, (1, "bf16", False)),
    ({"bf16": {"enabled": True}, "zero_optimization": {"stage": 2, "overlap_comm": True}}, (2, "bf16", True)),
    ({"fp16": {"enabled": True}, "zero_optimization": {"stage": 3}}, (3, "fp16", True)),
    ({"fp16": {"enabled": True}, "zero_optimization": {"stage": 3, "overlap_comm": False}}, (3, "fp16", False))])
def test_deepspeed_gradients_as_its_engine_picks_the_optimizer_wrapper(tmp_path, config, plan):
    assert tuple(_plan(_deepspeed(tmp_path, **config), "zero_stage", "grad_precision", "dp_overlap").values()) == plan


@pytest.mark.parametrize("config, clip", [
    ({"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}, "norm-scale"),  # ZeRO multiplies every step
    ({"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}, "norm"),  # ... the fp16 unscaling counted
    ({"fp16": {"enabled": True}}, "norm"),  # the FP16_Optimizer folds the factor into its Adam step
    ({"bf16": {"enabled": True}}, "norm"),  # the BF16_Optimizer scales only the steps it clips
    ({}, "none"),  # fp32 without ZeRO: torch's clip_grad_norm_ only with gradient_clipping
    ({"gradient_clipping": 1.0}, "norm-scale")])
def test_deepspeed_passes_over_the_gradients_as_its_optimizer_makes_them(tmp_path, config, clip):
    assert _plan(_deepspeed(tmp_path, **config), "grad_clip") == {"grad_clip": clip}


@pytest.mark.parametrize("config, note", [
    # DeepSpeed's ZeRO optimizer: 5e8-element buckets in the model's dtype, two with overlap_comm at stages 1-2
    ({"bf16": {"enabled": True}, "zero_optimization": {"stage": 2, "overlap_comm": True}}, "two contiguous gradient "
     "buckets, 2 GB"),
    ({"fp16": {"enabled": True}, "zero_optimization": {"stage": 3}}, "a contiguous gradient bucket, 1 GB"),
    ({"zero_optimization": {"stage": 1}}, "a contiguous gradient bucket, 2 GB"),  # fp32
    ({"fp16": {"enabled": True}, "zero_optimization": {"stage": 2, "contiguous_gradients": False}}, None),
    ({"fp16": {"enabled": True}}, None),  # no ZeRO optimizer
    ({"bf16": {"enabled": True}}, None)])  # the BF16_Optimizer keeps no buckets
def test_deepspeed_gradient_buckets_left_out_of_memory_are_said(tmp_path, config, note):
    notes = [n["why"] for n in _deepspeed(tmp_path, **config).unmapped if n["key"].endswith("reduce_bucket_size")]
    assert [note in n for n in notes] == ([] if note is None else [True])


@pytest.mark.parametrize("config, key", [
    ({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "bf16"}}, "grad_accum_dtype"),  # DeepSpeed raises
    ({"bf16": {"enabled": True}, "communication_data_type": "fp32"}, "communication_data_type"),
    ({"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}, "data_types": {"grad_accum_dtype": "fp32"}},
     "grad_accum_dtype"),  # kept in fp32, reduced in bf16
    ({"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}, "communication_data_type": "fp32"},
     "communication_data_type"),
    ({"fp16": {"enabled": True}, "communication_data_type": "int8"}, "communication_data_type"),
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "fp16.enabled")])
def test_deepspeed_gradients_kept_and_reduced_in_different_precisions_are_refused(tmp_path, config, key):
    with pytest.raises(InputError, match=key):
        _deepspeed(tmp_path, **config)


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "simulator.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_evaluate_from_a_torchtitan_config_reports_what_it_does_not_model(tmp_path):
    f = tmp_path / "flex.toml"
    f.write_text((DATA / "torchtitan-llama3_70b.toml").read_text().replace("[model]\n", "[model]\nuse_flex_attn = true\n"))
    proc = _cli("evaluate", "--from", "torchtitan", str(f), "--node", "dgx-h100",
                "--nodes", "8", "--engine", "analytic", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["feasible"] is True
    assert "model.use_flex_attn" in proc.stderr and "not modelled" in proc.stderr
    # what the config does not say is noted as such, with what was assumed
    assert "llmsim: note: torchtitan torch release (not in the config): taken as 2.9 or later" in proc.stderr


def test_import_writes_a_scenario_that_evaluates(tmp_path):
    out = tmp_path / "sub" / "gpt3.yaml"
    proc = _cli("import", "megatron", str(DATA / "megatron-train_gpt3_175b_distributed.sh"), "--node", "dgx-a100",
                "--nodes", "128", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "UNMAPPED  rampup-batch-size" in proc.stdout
    proc = _cli("evaluate", str(out), "--engine", "analytic", "--json")
    assert proc.returncode == 0, proc.stderr


def test_import_without_hardware_is_one_clean_line():
    proc = _cli("import", "torchtitan", str(DATA / "torchtitan-llama3_8b.toml"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "--node" in proc.stderr


def test_torchtitan_context_parallelism_runs_pytorchs_ring_with_its_rotate_method(tmp_path):
    # torchtitan's --parallelism.context_parallel_rotate_method, "allgather" by default
    text = (DATA / "torchtitan-llama3_8b.toml").read_text().replace("context_parallel_degree = 1",
                                                                        "context_parallel_degree = 4")
    cp = tmp_path / "cp.toml"
    cp.write_text(text)
    assert import_config("torchtitan", cp, {"cluster.node": "dgx-h100"}).scenario["plan"]["cp_attention"] == \
        "torch-allgather"
    cp.write_text(text.replace("[parallelism]", "[parallelism]\ncontext_parallel_rotate_method = \"alltoall\""))
    assert import_config("torchtitan", cp, {"cluster.node": "dgx-h100"}).scenario["plan"]["cp_attention"] == \
        "torch-alltoall"
    no_cp = import_config("torchtitan", DATA / "torchtitan-llama3_8b.toml", {"cluster.node": "dgx-h100"})
    assert "cp_attention" not in no_cp.scenario["plan"]


def test_torchtitan_keeps_fp32_parameters_as_the_master_copy():
    # the model is materialised in fp32 and FSDP2 casts it to bf16 for compute
    imported = import_config("torchtitan", DATA / "torchtitan-llama3_8b.toml", {"cluster.node": "dgx-h100"})
    assert imported.scenario["plan"]["fp32_params"] is True


LLAMA_405B_ARGV = ["--num-layers", "126", "--hidden-size", "16384", "--num-attention-heads", "128",
                   "--group-query-attention", "--num-query-groups", "8", "--ffn-hidden-size", "53248", "--swiglu",
                   "--seq-length", "8192", "--global-batch-size", "256", "--vocab-size", "128256", "--bf16",
                   "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "8"]


@pytest.mark.parametrize("split,layout,vpp", [
    (["--decoder-first-pipeline-num-layers", "15", "--decoder-last-pipeline-num-layers", "15"], None, None),
    (["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"],
     [15, 16, 16, 16, 16, 16, 16, 15], None),  # 126 + 2 over 8 stages, the end stages a layer less
    (["--pipeline-model-parallel-layout", "Et*15|(t*16|)*6,t*15L"], [15, 16, 16, 16, 16, 16, 16, 15], None),
    (["--pipeline-model-parallel-layout", "Et*7|(t*8|)*14t*7L"], [7] + [8] * 14 + [7], 2),
    (["--pipeline-model-parallel-layout=Et*15|(t*16|)*6,t*15L"], [15, 16, 16, 16, 16, 16, 16, 15], None),
    (["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
      "--virtual-pipeline-model-parallel-size", "2"], [7] + [8] * 14 + [7], 2)])
def test_megatron_uneven_pipeline_splits_are_the_stage_layers_megatron_builds(split, layout, vpp):
    plan = import_config("megatron", None, {"cluster.node": "dgx-h100", "cluster.nodes": 64},
                         argv=LLAMA_405B_ARGV + split).scenario["plan"]
    assert (plan.get("pipeline_layout"), plan.get("vpp")) == (layout, vpp)
    if layout is None:
        assert (plan["first_stage_layers"], plan["last_stage_layers"]) == (15, 15)


def test_megatron_first_last_counts_and_the_same_layout_predict_the_same_step():
    def step(split):
        imported = import_config("megatron", None, {"cluster.node": "dgx-h100", "cluster.nodes": 64},
                                 argv=LLAMA_405B_ARGV + split)
        return evaluate(scenario_from_dict(imported.scenario)).step_time_s
    assert step(["--decoder-first-pipeline-num-layers", "15", "--decoder-last-pipeline-num-layers", "15"]) == step(
        ["--pipeline-model-parallel-layout", "Et*15|(t*16|)*6,t*15L"])


@pytest.mark.parametrize("layout", ["t*126", "Et*125|L" + "|" * 6, "Et*63|t*63L", "(t)*999999999", "Et*126mL"])
def test_megatron_pipeline_layout_llmsim_cannot_take_is_refused(layout):
    """No embedding, a wrong stage count or layer count, an unrolled bomb; MTP is fine in the
    last stage but the model here has none (its layers would not add up)."""
    with pytest.raises(InputError, match="pipeline-model-parallel-layout"):
        import_config("megatron", None, {"cluster.node": "dgx-h100", "cluster.nodes": 64},
                      argv=LLAMA_405B_ARGV + ["--pipeline-model-parallel-layout", layout])


def test_megatron_sliding_windows_every_other_layer_from_the_first():
    """GPT-OSS in Megatron-LM: --window-size 127,0 (127 earlier tokens and the token itself) on
    layers 1, 3, 5, ... (1-indexed), every 2nd layer full attention: llmsim's window of 128 on
    layers 0, 2, 4, ... (0-indexed), as the GPT-OSS config.json imports."""
    argv = ["--num-layers", "12", *MOE_ARGV[2:], "--quick-geglu", "--window-size", "127,0"]
    model = import_config("megatron", None, {"cluster.node": "dgx-h100"},
                          argv=argv + ["--window-attn-skip-freq", "2"]).scenario["model"]
    assert (model["activation"], model["sliding_window"], model["sliding_window_freq"]) == ("geglu", 128, 2)
    hf = scenario_from_dict({"model": {"hf_config": str(HF / "gpt-oss-120b.json"), "seq_len": 4096},
                             "cluster": {"node": "dgx-h100"}, "plan": {"global_batch": 8}}).model
    assert (hf.sliding_window, hf.sliding_window_freq) == (128, 2)
    every = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=argv).scenario["model"]
    assert every["sliding_window_freq"] == 1
    # each 3rd layer full, the others windowed (Gemma 3 and 4 in Megatron-Bridge: 6)
    third = import_config("megatron", None, {"cluster.node": "dgx-h100"},
                          argv=argv + ["--window-attn-skip-freq", "3"]).scenario["model"]
    assert (third["sliding_window"], third["sliding_window_skip_freq"]) == (128, 3)
    for refused in ("0", "[1,1,0,0]*3"):  # no layer pattern llmsim has
        with pytest.raises(InputError, match="window-attn-skip-freq"):
            import_config("megatron", None, {"cluster.node": "dgx-h100"},
                          argv=argv + ["--window-attn-skip-freq", refused])
    full = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=argv + ["--window-attn-skip-freq", "1"])
    assert full.scenario["model"]["sliding_window"] == 0  # every layer full attention


def test_megatron_script_arithmetic_and_case_patterns():
    """$((...)) over integers is expanded (bash: / truncates); a `case` pattern such as
    `--data)` is the script's own option, not Megatron's."""
    script = "\n".join([
        "GPUS=8; NODES=2; TP=2", "PP=$(( GPUS * NODES / TP / 3 ))",
        'while [[ $# -gt 0 ]]; do case $1 in', '  --data) DATA="$2"; shift 2 ;;', "esac; done",
        "torchrun pretrain_gpt.py --num-layers 24 --hidden-size 1024 --num-attention-heads 16 "
        "--seq-length 2048 --global-batch-size 64 --tensor-model-parallel-size $TP "
        "--pipeline-model-parallel-size $((24 / 12)) --micro-batch-size $(( PP - 1 ))"])
    imported = import_config("megatron", None, {"cluster.node": "dgx-h100", "cluster.nodes": 2},
                             argv=script_words(script))
    assert _plan(imported, "tp", "pp", "micro_batch") == {"tp": 2, "pp": 2, "micro_batch": 1}  # 16/2/3 = 2
    assert "data)" not in set(_accounted(imported))


def test_megatron_script_arguments_in_a_variable_are_split_as_the_shell_runs_them():
    # Megatron-LM's 2021 examples: options="...", run_cmd="python pretrain_gpt.py ${options}",
    # sh -c "${run_cmd}"; a literal quoted message stays one word
    script = "\n".join(['options=" --tensor-model-parallel-size 8 \\', '   --pipeline-model-parallel-size 2 "',
                         'echo "with --fp16 and --micro-batch-size 9"',
                         'run_cmd="python -u pretrain_gpt.py $@ ${options}"', 'srun sh -c "${run_cmd}"'])
    assert parse_args(script_words(script)) == {"tensor-model-parallel-size": "8", "pipeline-model-parallel-size": "2"}


def test_megatron_bridge_run_config_is_the_run_it_describes():
    """Read by hand from the file: Llama 3 8B, 16k tokens, TP/PP/CP 1, global batch 8 of 1,
    MXFP8 (fp8 e4m3 with the mxfp8 recipe) with FP8 parameters, the distributed optimizer,
    gradients reduced in bf16 (grad_reduce_in_fp32 false), no recomputation."""
    imported = import_config("megatron", DATA / "bridge-llama3_8b_sft_gb200_fp8_mx_v1.yaml",
                             {"cluster.node": "dgx-b200"})
    s = scenario_from_dict(imported.scenario)
    m, p = s.model, s.plan
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn_hidden, m.vocab, m.seq_len) == (
        32, 4096, 32, 8, 128, 14336, 128256, 16384)
    assert (m.activation, m.norm, m.position_embedding, m.bias, m.tied_embeddings, m.experts) == (
        "swiglu", "rmsnorm", "rope", False, False, 0)
    assert (p.tp, p.pp, p.cp, p.vpp, p.micro_batch, p.global_batch, p.precision, p.fp8_params, p.zero_stage,
            p.grad_precision, p.dp_overlap, p.recompute, p.grad_accumulation_fusion) == (
        1, 1, 1, 1, 1, 8, "mxfp8", True, 1, "bf16", False, "none", True)
    keys = set(flatten(yaml.safe_load((DATA / "bridge-llama3_8b_sft_gb200_fp8_mx_v1.yaml").read_text())))
    assert keys <= set(_accounted(imported))
    unmapped = {u["key"]: u["why"] for u in imported.unmapped}
    assert set(unmapped) == {"mixed_precision.reuse_grad_buf_for_mxfp8_param_ag",
                             "dataset.packed_sequence_specs.packed_sequence_size"}
    # SQuAD samples packed 4096 tokens a sequence attend inside themselves: the user gives their length
    assert "model.document_tokens" in unmapped["dataset.packed_sequence_specs.packed_sequence_size"]


def test_megatron_bridge_gpt_oss_model_is_the_model_of_its_config_json(tmp_path):
    """The model is GPT-OSS 120B's config.json field by field but for its gate's name:
    Megatron's quick-GELU gated GLU where the config says silu, the same three GEMMs either
    way; the recipe recomputes the layernorm and moe_act modules and splits the 36 layers,
    windows on every other one, into 4 stages of 9: it evaluates and fits its H100s."""
    path = DATA / "bridge-gpt_oss_120b_pretrain_h100_fp8_mx_v1.yaml"
    imported = import_config("megatron", path, {"cluster.node": "dgx-h100", "cluster.nodes": 8})
    assert _plan(imported, "recompute", "recompute_modules") == {"recompute": "selective",
                                                                 "recompute_modules": ["moe_act", "layernorm"]}
    s = scenario_from_dict(imported.scenario)
    assert evaluate(s, "analytic").feasible
    model = s.model
    hf = scenario_from_dict({"model": {"hf_config": str(HF / "gpt-oss-120b.json"), "seq_len": 4096},
                             "cluster": {"node": "dgx-h100"}, "plan": {"global_batch": 8}}).model
    assert (model.activation, hf.activation) == ("geglu", "swiglu")
    assert dataclasses.replace(model, name=hf.name, activation=hf.activation) == hf
    assert _plan(imported, "ep", "pp") == {"ep": 8, "pp": 4}


@pytest.mark.parametrize("change,key", [
    ({}, "fp8_recipe"),  # the DeepSeek-V3 H100 recipe as published: its block-wise FP8
    ({"model": {"moe_flex_dispatcher_backend": "ncclep"}}, "moe_flex_dispatcher_backend"),  # NCCL EP
    ({"model": {"moe_token_dispatcher_type": "alltoall", "recompute_modules": ["mhc"]},
      "mixed_precision": {"fp8_recipe": "tensorwise"}}, "recompute_modules"),  # hyper-connections' recompute
    ({"peft": {"dim": 16}}, "peft"),
    # Gemma 3's own layer: norms after attention and MLP
    ({"model": {"transformer_layer_spec": {"_target_": "megatron.bridge.models.gemma.gemma3_provider."
                                                       "gemma3_layer_spec", "_call_": False}}},
     "transformer_layer_spec")])
def test_megatron_bridge_settings_llmsim_cannot_express_are_refused_by_name(tmp_path, change, key):
    data = yaml.safe_load((DATA / "bridge-deepseek_v3_pretrain_h100_fp8_sc_v1.yaml").read_text())
    for section, fields in change.items():
        data[section] = {**data[section], **fields} if isinstance(data.get(section), dict) else fields
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match=key):
        import_config("megatron", tmp_path / "c.yaml", {"cluster.node": "dgx-h100"})


def test_megatron_bridge_deepseek_v3_with_what_llmsim_models_is_deepseek_v3(tmp_path):
    """The H100 recipe (the flex dispatcher with Hybrid-EP) with tensor-wise FP8: DeepSeek-V3's
    config.json model (MTP included), its layout Et|(tt|)*30mL over 8 x 4 virtual stages (the
    MTP module with the loss), Adam with bf16 moments beside fp32 main parameters and bf16
    main gradients (the precision-aware optimizer: 4 + 2 + 2 B), its mla_up_proj and mlp
    recomputation; the plan evaluates, its dense layers on the ranks the layout puts them on,
    and fits the H100s NVIDIA publishes it for (no false out-of-memory)."""
    data = yaml.safe_load((DATA / "bridge-deepseek_v3_pretrain_h100_fp8_sc_v1.yaml").read_text())
    data["mixed_precision"]["fp8_recipe"] = "tensorwise"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    imported = import_config("megatron", tmp_path / "c.yaml", {"cluster.node": "dgx-h100", "cluster.nodes": 128})
    hf = model_from_dict({"hf_config": str(HF / "deepseek-v3.json"), "seq_len": 4096})
    assert dataclasses.replace(model_from_dict(imported.scenario["model"]), name=hf.name) == hf
    assert _plan(imported, "pipeline_layout", "vpp", "optimizer_precision", "grad_precision", "fp8_recipe", "ep") == {
        "pipeline_layout": [1] + [2] * 30 + [0], "vpp": 4, "optimizer_precision": "bf16-moments",
        "grad_precision": "bf16", "fp8_recipe": "current", "ep": 64}
    # the recipe's own SM knob for its backend (moe_hybridep_num_sms 32; moe_deepep_num_sms 20 is DeepEP's)
    assert (imported.scenario["plan"]["moe"]["dispatcher"], imported.scenario["plan"]["moe"]["dispatcher_sms"]) == (
        "hybridep", 32)
    assert _plan(imported, "recompute", "recompute_modules") == {"recompute": "selective",
                                                                 "recompute_modules": ["mlp", "mla_up_proj"]}
    s = scenario_from_dict(imported.scenario)
    assert evaluate(s, "analytic").feasible
    layout = compile_scenario(s)
    # 8 ranks x 4 virtual stages: rank 0 holds layers 0, 15-16, 31-32, 47-48 (layer 0 dense),
    # rank 1 layers 1-2 (dense), 17-18, 33-34, 49-50; ranks 2-6 eight MoE layers; rank 7 six
    assert [(int(r.count), int(r.layers)) for r in layout.stages] == [(1, 7), (1, 8), (5, 8), (1, 6)]


@pytest.mark.parametrize("source,field,value,key", [
    ("bridge-llama3_8b_sft_gb200_fp8_mx_v1.yaml", ("train", "global_batch_size"), 10**400, "magnitude"),
    ("bridge-llama3_8b_sft_gb200_fp8_mx_v1.yaml", ("model", "cp_comm_type"), [], "cp_comm_type"),
    ("nemo-grok1_314b.yaml", ("model", "global_batch_size"), None, "global_batch_size")])
def test_megatron_yaml_values_found_by_the_fuzz_are_one_input_error(tmp_path, source, field, value, key):
    """Each once reached Python's arithmetic as an internal error (tests/test_fuzz_cli.py)."""
    data = yaml.safe_load((DATA / source).read_text())
    data[field[0]][field[1]] = value
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match=key):
        import_config("megatron", tmp_path / "c.yaml", {"cluster.node": "dgx-h100"})


def test_zero_layers_per_virtual_stage_is_one_input_error():
    with pytest.raises(InputError, match="num-layers-per-virtual-pipeline-stage"):
        import_config("megatron", None, {"cluster.node": "dgx-h100"},
                      argv=[*MEGATRON_ARGV, "--num-layers-per-virtual-pipeline-stage", "0"])


# examples/sc21/run_table_1.sh @de7dc40f88: the sizes each case gives CONFIG.sh's MEGATRON_PARAMS
SC21_TABLE_1 = {"narayanan21_t1_1.7B": dict(TP=1, PP=1, MBS=16, GBS=512, NLS=24, HS=2304, NAH=24, DDP="torch",
                                            NNODES=4, MEGATRON_EXTRA_PARAMS="--checkpoint-activations"),
                "narayanan21_t1_39B": dict(TP=8, PP=2, MBS=4, GBS=1536, NLS=48, HS=8192, NAH=64, DDP="local",
                                           NNODES=64, MEGATRON_EXTRA_PARAMS="--checkpoint-activations")}


def _sc21_argv(case: dict) -> list[str]:
    """pretrain_gpt.py's arguments as SRUN.sh passes them: CONFIG.sh's MEGATRON_PARAMS with the
    case's values (the data and tokenizer paths, which the fixture leaves as placeholders, as
    words)."""
    params = re.search(r'MEGATRON_PARAMS="(.*?)"', (DATA / "megatron-sc21-CONFIG.sh").read_text(), re.S).group(1)
    words = re.sub(r"\$\{(\w+)\}", lambda m: str(case.get(m.group(1), m.group(1).lower())), params).split()
    return [w.replace("\\", "") for w in words if w != "\\"]


@pytest.mark.parametrize("row", sorted(SC21_TABLE_1))
def test_megatron_sc21_table_1_scripts_import_as_the_published_rows_plans(row):
    """The authors' scripts of Narayanan et al.'s Table 1 (torch's DDP up to 18B, overlapping
    the all-reduce with the backward pass; Megatron's local DDP after it from 39B; fp16 all-reduced
    as the parameters' own .grad) give the plan the row was written with by hand."""
    from simulator.validation.runs import load_runs
    case = SC21_TABLE_1[row]
    imported = import_config("megatron", None, {"cluster.node": "dgx-a100", "cluster.nodes": case["NNODES"]},
                             argv=_sc21_argv(case))
    # Aug 2021: before the fused accumulation (@83b1e42f30, Feb 2022), as the import notes
    # (torch's DDP never fuses: nothing to note)
    noted = any(u["key"] == "no-gradient-accumulation-fusion" for u in imported.unmapped)
    assert noted is (case["DDP"] == "local")
    ours = scenario_from_dict({**imported.scenario, "plan": {**imported.scenario["plan"],
                                                             "grad_accumulation_fusion": False}})
    published = next(r for r in load_runs() if r.id == row).build()
    assert ours.plan == published.plan
    assert (ours.plan.dp_overlap, ours.plan.grad_precision) == (case["DDP"] == "torch", "fp16")


@pytest.mark.parametrize("args, why", [
    (["--bf16"], "asserts --DDP-impl local"),  # bf16 forces fp32 accumulation, which asserts the local DDP
    (["--fp16", "--use-distributed-optimizer"], "asserts --DDP-impl local"),
    (["--fp16", "--pipeline-model-parallel-size", "2"], "every micro-batch")])
def test_megatron_torch_ddp_where_megatron_or_llmsim_cannot_run_it_is_refused(args, why):
    argv = [a for a in MEGATRON_ARGV if a not in ("--bf16", "--use-distributed-optimizer")]
    with pytest.raises(InputError, match=why):
        import_config("megatron", None, {"cluster.node": "dgx-a100"}, argv=[*argv, "--DDP-impl", "torch", *args])


def test_megatron_ddp_implementation_other_than_local_or_torch_is_refused():
    with pytest.raises(InputError, match="local or torch"):
        import_config("megatron", None, {"cluster.node": "dgx-a100"}, argv=[*MEGATRON_ARGV, "--DDP-impl", "apex"])


def test_megatron_2021_fp32_allreduce_does_nothing_under_torch_ddp():
    argv = [a for a in MEGATRON_ARGV if a not in ("--bf16", "--use-distributed-optimizer")]
    plan = import_config("megatron", None, {"cluster.node": "dgx-a100"},
                         argv=[*argv, "--fp16", "--fp32-allreduce", "--DDP-impl", "torch"]).scenario["plan"]
    assert (plan["grad_precision"], plan["dp_overlap"]) == ("fp16", True)


@pytest.mark.parametrize("reduce, grads", [('"float32"', "fp32"), ('"bfloat16"', "bf16"), ('"float16"', "fp16")])
def test_torchtitan_gradients_are_reduced_in_fsdps_reduce_dtype(tmp_path, reduce, grads):
    imported = _titan(tmp_path, "torchtitan-llama3_8b.toml", {"training.mixed_precision_reduce": reduce})
    assert imported.scenario["plan"]["grad_precision"] == grads


def test_torchtitan_reduce_dtype_of_another_name_is_refused(tmp_path):
    with pytest.raises(InputError, match="mixed_precision_reduce"):
        _titan(tmp_path, "torchtitan-llama3_8b.toml", {"training.mixed_precision_reduce": '"fp32"'})


@pytest.mark.parametrize("dtype, grads", [("bf16", "bf16"), ("fp32", "fp32"), ("fp16", "fp16")])
def test_nemo_gradients_are_synchronised_in_grad_sync_dtype(tmp_path, dtype, grads):
    data = yaml.safe_load((DATA / "nemo-llama3.1_8b.yaml").read_text())
    data["model"]["optim"]["grad_sync_dtype"] = dtype
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(data))
    plan = import_config("megatron", tmp_path / "n.yaml", {"cluster.node": "dgx-h100"}).scenario["plan"]
    assert plan["grad_precision"] == grads


@pytest.mark.parametrize("optim, key", [
    ({"grad_sync_dtype": "half-ish"}, "grad_sync_dtype"),
    ({"dtype": "fp16"}, "dtype"),  # Adam's states in fp16: not modelled
    ({"store_params": False}, "store_params"),  # fp32 states over bf16 weights with no master copy
    ({"dtype": "bf16", "store_params": False, "store_param_remainders": True}, "store_param_remainders"),
])
def test_nemo_optimizer_settings_llmsim_cannot_express_or_apex_would_not_keep_are_refused(tmp_path, optim, key):
    data = yaml.safe_load((DATA / "nemo-llama3.1_8b.yaml").read_text())
    data["model"]["optim"].update(optim)
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match=f"nemo model.optim.{key}"):
        import_config("megatron", tmp_path / "n.yaml", {"cluster.node": "dgx-h100"})


@pytest.mark.parametrize("args, clip", [
    ([], "norm-scale"),  # Megatron-Core 0.18 on with TransformerEngine, as the mapping says
    (["--clip-grad", "0"], "none"),
    (["--checkpoint-activations"], "norm")])  # Megatron-LM before 2022: scaled only on the steps it clips
def test_megatron_clipping_as_its_release_runs_it(args, clip):
    argv = [a for a in MEGATRON_ARGV if a not in ("--bf16", "--use-distributed-optimizer")]
    imported = import_config("megatron", None, {"cluster.node": "dgx-a100"}, argv=[*argv, *args])
    assert imported.scenario["plan"]["grad_clip"] == clip


@pytest.mark.parametrize("limit, clip", [(1.0, "norm"), (0.0, "none"), (None, "none")])
def test_nemo_clips_by_the_trainers_limit_without_a_scaling_pass(tmp_path, limit, clip):
    # NeMo's distributed_fused_adam folds the clip factor into its Adam step; null turns Lightning's off
    data = yaml.safe_load((DATA / "nemo-llama3.1_8b.yaml").read_text())
    data["trainer"]["gradient_clip_val"] = limit
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(data))
    imported = import_config("megatron", tmp_path / "n.yaml", {"cluster.node": "dgx-h100"})
    assert imported.scenario["plan"]["grad_clip"] == clip


@pytest.mark.parametrize("args, average_in_collective, nan_check", [
    ([], False, True),  # Megatron-LM's arguments: divide first, check every bucket
    (["--ddp-average-in-collective", "--no-check-for-nan-in-loss-and-grad"], True, False),
    (["--checkpoint-activations"], False, False)])  # before 2022: the local DDP divides; no check then
def test_megatron_passes_over_the_gradient_buffer_as_its_arguments_say(args, average_in_collective, nan_check):
    argv = [a for a in MEGATRON_ARGV if a not in ("--bf16", "--use-distributed-optimizer")]
    plan = import_config("megatron", None, {"cluster.node": "dgx-a100"}, argv=[*argv, *args]).scenario["plan"]
    assert (plan.get("dp_average_in_collective", False), plan.get("grad_nan_check", False)) == (
        average_in_collective, nan_check)


@pytest.mark.parametrize("optim, average_in_collective", [
    ({"name": "distributed_fused_adam"}, True),  # Apex reduce-scatters with ReduceOp.AVG
    ({"name": "mcore_distributed_optim"}, True),  # NeMo 24.09's default for Megatron-Core's DDP
    ({"name": "mcore_distributed_optim", "average_in_collective": False}, False)])
def test_nemo_averages_in_the_collective_unless_told_otherwise(tmp_path, optim, average_in_collective):
    data = yaml.safe_load((DATA / "nemo-llama3.1_8b.yaml").read_text())
    data["model"]["optim"].update(optim)
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(data))
    plan = import_config("megatron", tmp_path / "n.yaml", {"cluster.node": "dgx-h100"}).scenario["plan"]
    assert plan["dp_average_in_collective"] is average_in_collective
    assert not plan.get("grad_nan_check", False)


def test_torchtitan_clips_and_scales_every_step():
    imported = import_config("torchtitan", DATA / "torchtitan-llama3_8b.toml", {"cluster.node": "dgx-h100"})
    assert _plan(imported, "grad_clip") == {"grad_clip": "norm-scale"}


@pytest.mark.parametrize("args, fused, noted", [
    ([], True, False),  # Megatron-LM's default since Feb 2022
    (["--no-gradient-accumulation-fusion"], False, False),
    (["--checkpoint-activations"], True, True),  # a script of before 2022 may predate it: said
    (["--fp16", "--DDP-impl", "torch"], False, False)])  # torch's DDP has no main_grad to fuse into
def test_megatron_weight_gradients_accumulate_in_their_gemms_unless_switched_off(args, fused, noted):
    argv = [a for a in MEGATRON_ARGV if a not in ("--bf16", "--use-distributed-optimizer")]
    imported = import_config("megatron", None, {"cluster.node": "dgx-a100"}, argv=[*argv, *args])
    assert imported.scenario["plan"]["grad_accumulation_fusion"] is fused
    assert any(u["key"] == "no-gradient-accumulation-fusion" for u in imported.unmapped) is noted


@pytest.mark.parametrize("change, pp, dp, fused", [
    ({}, 1, 4, True),  # the fixture: megatron_amp_O2 with distributed_fused_adam
    ({"gradient_accumulation_fusion": None}, 1, 4, False),  # NeMo's default is off
    ({"megatron_amp_O2": False}, 1, 4, False),  # fused only under O2
    ({"optim": {"name": "fused_adam"}}, 1, 4, False),  # without pipelining, only with a distributed optimizer ...
    ({"optim": {"name": "fused_adam"}}, 1, 1, True),  # ... or on one data-parallel rank
    ({"optim": {"name": "fused_adam"}, "pipeline_model_parallel_size": 2}, 2, 2, True)])
def test_nemo_fuses_weight_gradient_accumulation_where_nemo_lets_it(tmp_path, change, pp, dp, fused):
    data = yaml.safe_load((DATA / "nemo-llama3.1_8b.yaml").read_text())
    for key, value in change.items():
        if value is None:
            del data["model"][key]
        elif isinstance(value, dict):
            data["model"][key].update(value)
        else:
            data["model"][key] = value
    data["model"]["context_parallel_size"] = 1
    data["trainer"]["devices"] = pp * dp
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(data))
    s = scenario_from_dict(import_config("megatron", tmp_path / "n.yaml", {"cluster.node": "dgx-h100"}).scenario)
    assert (s.plan.dp, s.plan.grad_accumulation_fusion) == (dp, fused)


def test_megatron_no_position_embedding_is_redundant_with_rope_and_refused_without():
    rope = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[
        *MEGATRON_ARGV, "--position-embedding-type", "rope", "--no-position-embedding"])
    assert rope.scenario["model"]["position_embedding"] == "rope"
    with pytest.raises(InputError, match="no-position-embedding"):  # Megatron-LM refuses it too
        import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[*MEGATRON_ARGV, "--no-position-embedding"])


@pytest.mark.parametrize("args, overlap", [
    (["--use-distributed-optimizer", "--overlap-grad-reduce"], False),  # gathered after the optimizer step
    (["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"], True),
    (["--overlap-grad-reduce"], None)])  # no distributed optimizer: no once-per-step gather
def test_megatron_distributed_optimizer_gathers_weights_ahead_only_with_overlap_param_gather(args, overlap):
    argv = [a for a in MEGATRON_ARGV if a != "--use-distributed-optimizer"]
    plan = import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[*argv, *args]).scenario["plan"]
    assert plan.get("param_gather_overlap") is overlap


def test_nemo_distributed_optimizer_gathers_weights_ahead_by_overlap_param_sync(tmp_path):
    data = yaml.safe_load((DATA / "nemo-llama3.1_8b.yaml").read_text())
    data["model"]["optim"]["overlap_param_sync"] = False
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(data))
    off = import_config("megatron", tmp_path / "n.yaml", {"cluster.node": "dgx-h100"}).scenario["plan"]
    on = import_config("megatron", DATA / "nemo-llama3.1_8b.yaml", {"cluster.node": "dgx-h100"}).scenario["plan"]
    assert (off["param_gather_overlap"], on["param_gather_overlap"]) == (False, True)


def test_megatron_bridge_reads_its_models_gradient_accumulation_fusion(tmp_path):
    data = yaml.safe_load((DATA / "bridge-llama3_8b_sft_gb200_fp8_mx_v1.yaml").read_text())
    data["model"]["gradient_accumulation_fusion"] = False
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(data))
    plan = import_config("megatron", tmp_path / "b.yaml", {"cluster.node": "dgx-b200"}).scenario["plan"]
    assert plan["grad_accumulation_fusion"] is False


def test_deepspeed_engines_add_every_weight_gradient_apart(tmp_path):
    """Neither DeepSpeed's engine nor Megatron-DeepSpeed's linears fuse the accumulation."""
    ds = import_config("deepspeed", DATA / "deepspeed-ds_config_zero3.json",
                       {"model.preset": "llama-2-7b", "cluster.node": "dgx-a100", "plan.global_batch": 64})
    assert ds.scenario["plan"]["grad_accumulation_fusion"] is False
    assert _mds(tmp_path).scenario["plan"]["grad_accumulation_fusion"] is False


@pytest.mark.parametrize("stage, overlap", [(1, False), (2, False), (3, None)])
def test_deepspeed_zero_1_and_2_gather_the_weights_after_the_optimizer_step(tmp_path, stage, overlap):
    plan = _plan(_deepspeed(tmp_path, zero_optimization={"stage": stage, "overlap_comm": True}),
                 "param_gather_overlap", "dp_overlap")
    assert plan == {"param_gather_overlap": overlap, "dp_overlap": True}


MDS_SCRIPT = DATA / "megatron-deepspeed-pretrain_llama2_distributed.sh"


def _mds(tmp_path, replace: dict | None = None, **overrides):
    """Megatron-DeepSpeed's Llama 2 example with the script's text `replace`d, imported (its
    SentencePiece tokenizer's vocabulary given, as the script cannot)."""
    text = MDS_SCRIPT.read_text()
    for old, new in (replace or {}).items():
        assert old in text
        text = text.replace(old, new)
    (tmp_path / "run.sh").write_text(text)
    return import_config("megatron", tmp_path / "run.sh", {"cluster.node": "dgx-a100", "model.vocab": 32000,
                                                           **overrides})


def test_megatron_deepspeed_example_imports_with_its_own_argument_names_and_deepspeeds_engine(tmp_path):
    """microsoft/Megatron-DeepSpeed's Llama 2 example: GQA by --num-key-value-heads, RoPE by
    --use-rotary-position-embeddings, lowercase rmsnorm, and bf16 under DeepSpeed ZeRO-0 from the
    config its here-document writes: DeepSpeed's BF16_Optimizer, the pipeline engine's 1F1B."""
    imported = _mds(tmp_path)
    s = scenario_from_dict(imported.scenario)
    assert (s.model.kv_heads, s.model.norm, s.model.position_embedding, s.model.bias, s.model.tied_embeddings) == (
        4, "rmsnorm", "rope", False, False)
    assert (s.plan.tp, s.plan.pp, s.plan.schedule, s.plan.precision, s.plan.zero_stage, s.plan.grad_precision,
            s.plan.dp_overlap, s.plan.flash_attention) == (2, 2, "1f1b", "bf16", 1, "fp32", False, False)
    assert s.plan.recompute == "none"  # its recomputation flags sit in an `if` its activation_checkpoint="false" skips
    assert any(m["key"] == "./tmp/deepspeed.json:zero_optimization.stage" for m in imported.mapped)


def test_megatron_deepspeed_config_beside_the_script_is_read(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                                                  "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}))
    plan = _mds(tmp_path, {"cat <<EOT > $DS_CONFIG": "cat <<EOT > unused.json", "ZERO_STAGE=0": "ZERO_STAGE=1",
                           "DS_CONFIG=${BASE_PATH}/deepspeed.json": "DS_CONFIG=ds.json"}).scenario["plan"]
    assert (plan["zero_stage"], plan["grad_precision"]) == (1, "bf16")  # ZeRO-1 keeps bf16 gradients


@pytest.mark.parametrize("replace, key", [
    ({"DS_CONFIG=${BASE_PATH}/deepspeed.json": "DS_CONFIG=missing.json",
      "cat <<EOT > $DS_CONFIG": "cat <<EOT > other.json"}, "deepspeed_config"),
    ({'"enabled": true': '"enabled": false'}, "bf16.enabled"),  # DeepSpeed in fp32, the script in bf16
    ({"ZERO_STAGE=0": "ZERO_STAGE=2"}, "zero_optimization.stage"),  # the pipeline engine runs ZeRO-0 or 1
    ({"--bf16 \\": "--bf16 --use-flash-attn \\"}, "use-flash-attn"),  # FlashAttention 1
    ({"--bf16 \\": "--bf16 --ds-sequence-parallel-size 2 \\"}, "ds-sequence-parallel-size"),
    ({'"stage": $ZERO_STAGE': '"stage": 1'}, "zero-stage"),  # the script says 0, its config 1
    ({"--bf16 \\": "--bf16 --enable-zbh1-pipeline \\"}, "enable-zbh1-pipeline"),
    ({'"bf16": {': '"fp16": {"enabled": true},\n  "bf16": {'}, "fp16.enabled")])  # DeepSpeed asserts one
def test_megatron_deepspeed_what_it_cannot_run_or_llmsim_cannot_model_is_refused(tmp_path, replace, key):
    with pytest.raises(InputError, match=key):
        _mds(tmp_path, replace)


def test_megatron_deepspeed_flash_attention_2_and_zero_2_without_the_pipeline_engine(tmp_path):
    plan = _mds(tmp_path, {"--bf16 \\": "--bf16 --use-flash-attn-v2 --no-pipeline-parallel \\", "PP=2": "PP=1",
                           "ZERO_STAGE=0": "ZERO_STAGE=2"}).scenario["plan"]
    assert (plan["flash_attention"], plan["attention_kernel"], plan["zero_stage"], plan["dp_overlap"]) == (
        True, "flash2", 2, False)  # overlap_comm: DeepSpeed's default is off below ZeRO-3


def test_megatron_deepspeed_names_mean_nothing_to_megatron_lm():
    imported = import_config("megatron", None, {"cluster.node": "dgx-a100"},
                             argv=[*MEGATRON_ARGV, "--num-key-value-heads", "4"])
    assert imported.scenario["model"]["kv_heads"] == 16
    assert "num-key-value-heads" in [u["key"] for u in imported.unmapped]


def test_script_here_documents_are_the_files_they_write():
    from simulator.importers.launch_script import script_words
    files = {}
    words = script_words("N=4\nOUT=cfg.json\ncat <<EOT > $OUT\n{\"n\": $N}\nEOT\ncat <<'RAW' > raw.txt\n$N\nRAW\n"
                         "cat <<-TABS > tabs.txt\n\tx $N\n\tTABS\nsbatch <<EOF 2>&1\npython train.py --n $N\nEOF\n",
                         files)
    assert files == {"cfg.json": '{"n": 4}\n', "raw.txt": "$N\n", "tabs.txt": "x 4\n"}
    assert words[-3:] == ["--n", "4", "EOF"]  # a document a command runs is read as script


@pytest.mark.parametrize("method, recompute", [("uniform", "full"), ("block", "none")])
def test_megatron_deepspeed_pipeline_engine_recomputes_uniform_intervals_only(tmp_path, method, recompute):
    plan = _mds(tmp_path, {'activation_checkpoint="false"': 'activation_checkpoint="true"',
                           "--recompute-method uniform": f"--recompute-method {method}"}).scenario["plan"]
    assert plan["recompute"] == recompute


@pytest.mark.parametrize("experts, refused", [("1", False), ("1 1", False), ("64", True), ("64 64 128", True)])
def test_megatron_deepspeed_experts_are_deepspeed_moe_and_refused(tmp_path, experts, refused):
    replace = {"--bf16 \\": f"--bf16 --num-experts {experts} \\"}
    if refused:
        with pytest.raises(InputError, match="num-experts"):
            _mds(tmp_path, replace)
    else:
        assert "experts" not in _mds(tmp_path, replace).scenario["model"]


def test_megatron_deepspeed_config_that_is_no_json_object_is_refused(tmp_path):
    (tmp_path / "ds.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="expected a JSON object"):
        _mds(tmp_path, {"cat <<EOT > $DS_CONFIG": "cat <<EOT > unused.json",
                        "DS_CONFIG=${BASE_PATH}/deepspeed.json": "DS_CONFIG=ds.json"})


@pytest.mark.parametrize("script, value", [
    ('A=1\nif [ "$A" = 1 ]; then X=yes; else X=no; fi', "yes"),
    ("A=0\nif [ $A = 1 ]; then X=one; elif [[ $A -eq 0 ]]; then X=zero; else X=other; fi", "zero"),
    ("A=5\nif [[ $A -gt 9 ]] || [ -z \"$A\" ]; then X=big; else X=small; fi", "small"),
    ("A=ab\nif [ ! $A != ab ] && [ -n $A ]; then X=ab; fi", "ab"),
    ("A=1\nif [ $A = 1 ]; then if [ $A = 2 ]; then X=two; else X=one; fi; fi", "one"),
    ("if [ -f run.cfg ]; then X=file; else X=none; fi", "none"),  # not told: both read, the last wins
    ("if [ $UNSET = 1 ]; then X=set; fi", "set")])  # not told: read
def test_script_if_runs_the_branch_its_test_of_known_values_picks(script, value):
    from simulator.importers.launch_script import script_words
    assert script_words(script + "\npython t.py --x $X")[-1] == value


def test_megatron_collectives_other_than_nccls_are_refused():
    assert "distributed-backend" not in [u["key"] for u in import_config(
        "megatron", None, {"cluster.node": "dgx-a100"}, argv=[*MEGATRON_ARGV, "--distributed-backend", "nccl"]).unmapped]
    with pytest.raises(InputError, match="distributed-backend"):
        import_config("megatron", None, {"cluster.node": "dgx-a100"}, argv=[*MEGATRON_ARGV, "--distributed-backend",
                                                                             "gloo"])


def test_megatron_deepspeed_checkpoint_storage_is_reported_where_on(tmp_path):
    config = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True},
              "activation_checkpointing": {"partition_activations": True, "cpu_checkpointing": False}}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    imported = _mds(tmp_path, {"cat <<EOT > $DS_CONFIG": "cat <<EOT > unused.json",
                               "DS_CONFIG=${BASE_PATH}/deepspeed.json": "DS_CONFIG=ds.json"})
    unmapped = {u["key"]: u["why"] for u in imported.unmapped}
    assert "TP ranks" in unmapped["ds.json:activation_checkpointing.partition_activations"]
    assert "ds.json:activation_checkpointing.cpu_checkpointing" in [i["key"] for i in imported.ignored]
