"""What a published run did that a scenario may not be able to say: one named feature each.

A supplement names the features a run used (`features: {op-selective-recompute: true}`).
Each feature here knows

- `supported()`: whether llmsim can express it today, probed from the scenario schema
  (the plan keys and allowed values in plan.py and model.py), so that a run starts being
  predicted by itself the day the schema learns the feature;
- `apply(scenario, value)`: how the run's scenario says it once supported;
- `fallback(scenario, value)`: the nearest scenario llmsim can evaluate today, with a
  sentence saying what it changes, or None where there is none;
- `equivalent`: the fallback has the same FLOPs, bytes moved and bytes kept in llmsim's
  terms, so a run using it is still predicted and lists it as an assumption. Every other
  unsupported feature makes a run "not expressible" (listed with its reason); its
  fallback is used only when asked (`llmsim validate --published --approximate`), and the
  run is then reported apart, as approximated.

The future field names (plan.first_stage_layers, plan.last_stage_layers, plan.pipeline_layout,
plan.recompute:
op-selective, plan.fp8_recipe, plan.compile, plan.fsdp_reshard_after_forward,
model.activation: squared-relu) follow issue 9; where the schema ends up naming them
differently, only the probe and `apply` below change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .. import model as model_schema
from .. import plan as plan_schema
from ..errors import InputError


def _plan_key(key: str) -> Callable[[], bool]:
    return lambda: key in plan_schema.PLAN_KEYS


def _set(section: str, **fields) -> Callable[[dict, Any], None]:
    def apply(scenario: dict, value: Any) -> None:
        scenario.setdefault(section, {}).update(fields)
    return apply


def _entered_as(text: str, section: str = "plan", **fields) -> Callable[[dict, Any], str]:
    """A fallback that sets `fields` in `section` and says so."""
    def fallback(scenario: dict, value: Any) -> str:
        scenario.setdefault(section, {}).update(fields)
        return text
    return fallback


@dataclass(frozen=True)
class Feature:
    name: str
    reason: str  # what the run did that llmsim cannot say today
    supported: Callable[[], bool]
    apply: Callable[[dict, Any], None]
    fallback: Callable[[dict, Any], str] | None = None
    equivalent: bool = False


# ---------------------------------------------------------------- uneven pipeline stages

def _layers(value, name: str, what: str) -> list[int]:
    if not isinstance(value, dict) or not isinstance(value.get(what), list):
        raise InputError(f"features.{name}", value, f"expected {{{what}: [layers, first to last]}}")
    return [int(n) for n in value[what]]


def _apply_uneven(scenario: dict, value) -> None:
    """Megatron-Core's --decoder-first/last-pipeline-num-layers (num_layers_in_first/last_
    pipeline_stage): layers of the first and the last pipeline rank; the ranks between split
    the rest evenly, and with interleaving each rank splits its layers evenly over its virtual
    stages (NVIDIA/Megatron-LM@d98e8a64dd megatron/core/transformer/transformer_block.py
    get_num_layers_to_build)."""
    layers = _layers(value, "uneven-pipeline-stages", "rank_layers")
    if len(set(layers[1:-1])) > 1:
        raise InputError("features.uneven-pipeline-stages", layers,
                         "ranks between the first and the last must hold equal layer counts")
    scenario["plan"].update(first_stage_layers=layers[0], last_stage_layers=layers[-1])


UNEVEN_STAGES = Feature(
    "uneven-pipeline-stages",
    "pipeline ranks hold different layer counts (e.g. 126 layers over 8 ranks: 15, 16 x 6, 15, "
    "Megatron's --decoder-first/last-pipeline-num-layers); llmsim needs pp x vpp to divide the layers",
    _plan_key("first_stage_layers"), _apply_uneven)


def _apply_layout(scenario: dict, value) -> None:
    scenario["plan"]["pipeline_layout"] = _layers(value, "pipeline-layout", "stage_layers")


PIPELINE_LAYOUT = Feature(
    "pipeline-layout",
    "virtual pipeline stages of one rank hold different layer counts (torchtitan Interleaved1F1B "
    "with 126 layers over 16 stages: 7, 8 x 14, 7, so rank 0 runs 7 + 8); only a per-stage layout "
    "(Megatron's --pipeline-model-parallel-layout) says it, first/last rank counts cannot",
    _plan_key("pipeline_layout"), _apply_layout)


# ---------------------------------------------------------------- activation checkpointing

OP_SELECTIVE_RECOMPUTE = Feature(
    "op-selective-recompute",
    "torchtitan op-level selective activation checkpointing (saves matmul outputs except every "
    "other one, attention and reduce-scatter outputs; recomputes the rest)",
    lambda: "op-selective" in plan_schema.RECOMPUTE, _set("plan", recompute="op-selective"),
    _entered_as("op-level selective AC entered as recompute: selective (Megatron's core-attention recompute; "
                "with flash attention it recomputes nothing, so memory and time are those of no recompute)",
                recompute="selective"))


# ---------------------------------------------------------------- FP8

FP8_RECIPES = ("delayed", "current", "tensorwise", "rowwise", "mxfp8")


def _fp8_recipe(value) -> str:
    recipe = value.get("recipe") if isinstance(value, dict) else value
    if recipe not in FP8_RECIPES:
        raise InputError("features.fp8-linears", value, "expected {recipe: " + "|".join(FP8_RECIPES) + "}")
    return recipe


def _apply_fp8(scenario: dict, value) -> None:
    recipe = _fp8_recipe(value)
    scenario["plan"].update(precision="mxfp8" if recipe == "mxfp8" else "fp8")
    if recipe != "mxfp8":
        scenario["plan"]["fp8_recipe"] = recipe
    weights = value.get("primary_weights", "bf16") if isinstance(value, dict) else "bf16"
    if weights not in ("bf16", "fp8"):
        raise InputError("features.fp8-linears.primary_weights", weights, "expected bf16 or fp8")
    if weights == "fp8":  # TransformerEngine FP8 primary weights (NeMo fp8_params)
        scenario["plan"]["fp8_params"] = True


def _fp8_fallback(scenario: dict, value) -> str:
    recipe = _fp8_recipe(value)
    return f"FP8 linears ({recipe} scaling) entered as BF16 (every GEMM at the BF16 rate: predicts slow)"


FP8_LINEARS = Feature(
    "fp8-linears",
    "FP8 GEMMs in the linear layers only (TransformerEngine / torchao recipe: attention, lm_head "
    "and the rest stay in BF16; cast and amax kernels; scaling recipe)",
    _plan_key("fp8_recipe"), _apply_fp8, _fp8_fallback)


FP8_EXPERT_LINEARS = Feature(
    "fp8-moe-linears",
    "FP8 GEMMs in a Mixture-of-Experts model's linears, the grouped expert GEMMs among them "
    "(TransformerEngine recipes; fp8.py)",
    _plan_key("fp8_recipe"), _apply_fp8, _fp8_fallback)


# ---------------------------------------------------------------- kernels and framework

EAGER_MODE = Feature(
    "eager-mode",
    "eager PyTorch without torch.compile: unfused memory-bound kernels; llmsim counts the "
    "traffic of fused kernels and has no setting for fusion",
    _plan_key("compile"), _set("plan", compile=False),
    _entered_as("eager PyTorch predicted as if compiled (llmsim's memory-bound kernels are fused ones)"))


def _async_tp_supported() -> bool:
    return "async-tp" in plan_schema.TP_OVERLAPS


ASYNC_TP = Feature(
    "async-tp",
    "PyTorch async tensor parallelism (collective matmuls through symmetric memory)",
    _async_tp_supported, _set("plan", tp_comm_overlap=True, tp_overlap="async-tp"))


FSDP_NO_RESHARD = Feature(
    "fsdp-no-reshard-after-forward",
    "FSDP2 with reshard_after_forward=False (torchtitan with PP): parameters stay gathered "
    "across the micro-batches of a step",
    _plan_key("fsdp_reshard_after_forward"), _set("plan", fsdp_reshard_after_forward=False),
    _entered_as("FSDP2 without resharding after forward (one all-gather per step under PP) entered as "
                "zero_stage 3 (gathers every micro-batch)"))


SQUARED_RELU = Feature(
    "squared-relu",
    "squared-ReLU MLP (Nemotron)",
    lambda: "squared-relu" in model_schema.ACTIVATIONS, _set("model", activation="squared-relu"),
    _entered_as("squared-ReLU MLP entered as gelu: both are 2-GEMM MLPs with one elementwise op that "
                "reads and writes the same bytes and keeps its input", "model", activation="gelu"),
    equivalent=True)


FEATURES = {f.name: f for f in (UNEVEN_STAGES, PIPELINE_LAYOUT, OP_SELECTIVE_RECOMPUTE, FP8_LINEARS, FP8_EXPERT_LINEARS, EAGER_MODE, ASYNC_TP,
                                FSDP_NO_RESHARD, SQUARED_RELU)}


def feature(name: str) -> Feature:
    if name not in FEATURES:
        raise InputError("features", name, "known: " + ", ".join(FEATURES))
    return FEATURES[name]
