"""Random valid plans for the property tests (hypothesis strategies): every schedule,
recompute mode (Megatron selective over its modules/full uniform/block, torch's early-stopping full,
torchtitan op-level), Megatron-Core's placement of the router's probabilities, precision (FP8
recipes on H100), sliding windows and packed documents, TP implementation (Megatron-LM or DTensor) and overlap, eager or compiled
kernels, FSDP resharding, uneven pipeline ranks, Megatron-LM's or PyTorch's pipeline runtime.

Plans are built valid by construction where the rules are simple (divisors, batch
multiples) and the rest is left to plan validation; a draw the validation refuses is
rejected, not counted."""

from __future__ import annotations

import os

from hypothesis import assume, strategies as st

from simulator import InputError, scenario_from_dict
from simulator.schedules import SCHEDULES as SCHEDULE_CLASSES

# CI draws the same plans on every run; HYPOTHESIS_PROFILE=long draws new ones each time (how
# two of the bugs fixed on 2026-12-07 were found: the fixed draws had passed them for days).
FIXED_DRAWS = os.environ.get("HYPOTHESIS_PROFILE") != "long"

MODELS = {  # preset, layers, query heads, kv heads
    "megatron-gpt-1.7b": (24, 24, 24),
    "llama-3.1-8b": (32, 32, 8),
    "llama-2-13b": (40, 40, 40),
}
MOE_MODELS = {  # preset: layers, query heads, kv heads, routed experts, overrides of the preset
    "mixtral-8x7b": (32, 32, 8, 8, {}),
    "qwen3-30b-a3b": (48, 32, 4, 128, {}),  # head_dim 128 x 32 heads != hidden 2048
    # MLA, shared expert, 3 leading dense layers; 16 layers keep it small; MTP drawn (cp = 1)
    "deepseek-v3": (16, 128, 128, 256, {"mtp_layers": 0, "layers": 16}),
}
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe-v")


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def plan_dicts(draw, zero_stages=(0, 1, 2, 3), offloads=True, max_seq_exp=15, moe=False,
               losses=("unfused", "unfused", "fused", "chunked", "loss-parallel")):
    """A scenario mapping with a random plan on 1-4 DGX nodes; with `moe`, of an MoE model
    with random ep, etp and MoE options."""
    preset = draw(st.sampled_from(sorted(MOE_MODELS if moe else MODELS)))
    layers, heads, kv, experts, overrides = MOE_MODELS[preset] if moe else (*MODELS[preset], 0, {})
    node = draw(st.sampled_from(["dgx-a100", "dgx-h100"]))
    nodes = draw(st.sampled_from([1, 2, 4]))
    devices = 8 * nodes
    seq = 2 ** draw(st.integers(9, max_seq_exp))
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if heads % t == 0 and (kv % t == 0 or t % kv == 0)]))
    schedule = draw(st.sampled_from(SCHEDULES))
    chunks = {"zb-v": 2, "dualpipe-v": 2}.get(schedule, 1)
    vpp = draw(st.sampled_from([2, 3, 4])) if schedule == "interleaved" else 1
    chunks = vpp if schedule == "interleaved" else chunks
    balanced = draw(st.integers(0, 3)) == 0  # the balanced split, which also takes sizes that do not divide
    pps = [p for p in _divisors(devices // tp) if (balanced or layers % (p * chunks) == 0) and p <= 8]
    assume(pps)
    pp = draw(st.sampled_from(pps))
    cp = draw(st.sampled_from([c for c in (1, 2) if (devices // (tp * pp)) % c == 0]))
    dp = devices // (tp * pp * cp)
    if preset == "deepseek-v3" and cp == 1:  # Megatron-Core runs MTP without CP only
        overrides = {**overrides, "mtp_layers": draw(st.sampled_from([0, 1]))}
    if not moe and cp == 1:  # sliding windows on every layer (Mistral's) or every other (GPT-OSS's), without CP
        overrides = {**overrides, "sliding_window": draw(st.sampled_from([0, 0, 512])),
                     "sliding_window_freq": draw(st.sampled_from([1, 2]))}
    # packed documents (attention inside each; with CP, TransformerEngine's methods only)
    overrides = {**overrides, "document_tokens": draw(st.sampled_from([0, 0, 0, 256, 384]))}
    micro_batch = draw(st.sampled_from([1, 2, 4]))
    m = draw(st.integers(1, 24))
    if schedule == "interleaved":
        m = pp * max(1, m // pp)
    if chunks == 2 and schedule != "interleaved":
        m = max(m, 2 * pp)
    zero = draw(st.sampled_from(zero_stages))
    offload = {"optimizer": "none", "params": "none", "activations": "none"}
    if offloads:
        if zero >= 1:
            offload["optimizer"] = draw(st.sampled_from(["none", "none", "cpu", "nvme"]))
        if zero == 3:
            offload["params"] = draw(st.sampled_from(["none", "none", "cpu"]))
        offload["activations"] = draw(st.sampled_from(["none", "none", "none", "cpu"]))
    flash = draw(st.booleans())
    sp = draw(st.booleans()) or (experts > 0 and tp > 1)  # MoE layers with TP need sequence parallelism
    extra = {}
    recompute = draw(st.sampled_from(["none", "selective", "full"]))
    # TransformerEngine's FP8 for MoE layers and MLA
    precision = draw(st.sampled_from(["bf16", "bf16", "fp32"] + (["fp8"] if node == "dgx-h100" else [])))
    if precision == "fp8":
        extra = {"fp8_recipe": "delayed", "fp8_params": draw(st.booleans())}
    if moe and preset != "deepseek-v3":  # unfused accumulation: MoE layers yes, MLA refuses it
        extra["grad_accumulation_fusion"] = draw(st.booleans())
    if not moe:  # framework options of the dense path (MoE and MLA models refuse them: moe.check_layer_mix_options)
        recompute = draw(st.sampled_from(["none", "selective", "full", "op-selective"]))
        precision = draw(st.sampled_from(["bf16", "bf16", "fp32"] + (["fp8"] if node == "dgx-h100" else [])))
        extra = {"compile": draw(st.booleans()), "tp_overlap": draw(st.sampled_from(["userbuffers", "async-tp"])),
                 "optimizer_precision": draw(st.sampled_from(["fp32", "bf16", "bf16-moments"])),
                 "grad_accumulation_fusion": draw(st.booleans())}
        # DTensor's parallel linears (torchtitan) overlap their TP collectives only by async TP
        extra["tp_impl"] = draw(st.sampled_from(["megatron", "dtensor"])) if extra["tp_overlap"] == "async-tp" \
            else "megatron"
        if recompute == "full":
            extra["recompute_method"] = draw(st.sampled_from(["uniform", "block"]))
            extra["recompute_num_layers"] = draw(st.sampled_from([1, 2, 3]))
            # torch's non-reentrant checkpoint a layer at a time (not for torchao's eager FP8 linears)
            if extra["recompute_num_layers"] == 1 and (extra["compile"] or precision != "fp8"):
                extra["recompute_early_stop"] = draw(st.booleans())
        if precision == "fp8":
            extra["fp8_recipe"] = draw(st.sampled_from(["delayed", "tensorwise", "rowwise"]))
            extra["fp8_params"] = extra["fp8_recipe"] == "delayed" and draw(st.booleans())
        if flash:
            extra["attention_kernel"] = draw(st.sampled_from(["fused", "flash2"]))
        if zero == 3:
            extra["zero3_impl"] = draw(st.sampled_from(["fsdp2", "deepspeed"]))
            extra["fsdp_reshard_after_forward"] = extra["zero3_impl"] == "deepspeed" or draw(st.booleans())
            if precision == "fp8" and extra.get("fp8_recipe") == "tensorwise" and extra["zero3_impl"] == "fsdp2":
                extra["fp8_fsdp_all_gather"] = draw(st.booleans())
        extra["pp_scatter_gather"] = draw(st.booleans())
        if offload["activations"] == "none":  # PyTorch's pipeline runtime (pipebuffers.py)
            extra["pp_impl"] = draw(st.sampled_from(["megatron", "torch"]))
            if extra["pp_impl"] == "torch":
                extra["pp_outputs"] = draw(st.sampled_from(["in-flight", "last-stage", "every-stage"]))
        if zero >= 1 and extra.get("zero3_impl") != "deepspeed":  # hybrid sharding: replicas of dp/dp_replicate ranks
            extra["dp_replicate"] = draw(st.sampled_from([r for r in (1, 1, 2, 4) if dp % r == 0]))
        extra["projections"] = draw(st.sampled_from(["fused", "separate"]))
        extra["cp_attention"] = draw(st.sampled_from(["ring", "kv-allgather", "ulysses", "ulysses-ring",
                                                      "torch-allgather", "torch-alltoall"]))
        if extra["cp_attention"] == "ulysses-ring":  # all-to-alls over all of the (at most 2) CP ranks
            extra["cp_ulysses"] = cp
        if extra["optimizer_precision"] == "fp32" and offload["optimizer"] == offload["params"] == "none":
            extra["fp32_params"] = draw(st.booleans())
        if precision != "fp32" and not extra.get("fp32_params") and not extra.get("fp8_params") \
                and offload["optimizer"] == "none":  # the master copy as Apex's and TE's Adam keep it
            own = "none" if extra["optimizer_precision"] == "bf16" else "remainders"
            extra["master_weights"] = draw(st.sampled_from([None, own]))
    extra["grad_clip"] = draw(st.sampled_from(["none", "norm", "norm-scale"]))
    extra["dp_average_in_collective"], extra["grad_nan_check"] = draw(st.booleans()), draw(st.booleans())
    even = layers // (pp * chunks) * chunks  # layers per rank
    per_virtual = layers // (pp * chunks)
    split = "balanced" if balanced else draw(st.sampled_from(["even", "first-last", "middles"]))
    if split == "balanced":
        extra["pipeline_split"] = "balanced"
    elif split == "first-last" and pp > 1 and even > chunks:  # uneven ranks: one chunk's layers moved
        extra.update(first_stage_layers=even - chunks, last_stage_layers=even + chunks)
    elif split == "middles" and pp >= 4 and per_virtual > 1:  # ranks 1 and 2 differ by two layers
        order = SCHEDULE_CLASSES[schedule]
        rank_of = [order.stage_chunk(k, pp)[0] for k in range(pp * chunks)]
        layout = [per_virtual] * (pp * chunks)
        layout[rank_of.index(1)] += 1
        layout[rank_of.index(2)] -= 1
        extra["pipeline_layout"] = layout
    if recompute == "selective":  # Megatron-Core's recompute modules (validation refuses the ones a model lacks)
        candidates = ["core_attn", "mlp", "layernorm"] + (["moe", "moe_act", "shared_experts", "mla_up_proj"]
                                                          if moe else [])
        extra["recompute_modules"] = draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=3, unique=True)) \
            if draw(st.booleans()) else ["core_attn"]
    if zero in (1, 2):
        gathers = draw(st.sampled_from([None, True, False]))
        if gathers is not None:
            extra["param_gather_overlap"] = gathers
    loss = draw(st.sampled_from(losses))
    data = {
        "model": {"preset": preset, "seq_len": seq, **overrides},
        "cluster": {"node": node, "nodes": nodes},
        "plan": {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "vpp": vpp, "schedule": schedule,
                 "micro_batch": micro_batch, "global_batch": micro_batch * dp * m,
                 "sequence_parallel": sp, "recompute": recompute, "zero_stage": zero, "offload": offload,
                 "flash_attention": flash, "dp_overlap": draw(st.booleans()),
                 "tp_comm_overlap": draw(st.booleans()), "precision": precision, **extra,
                 "loss": loss if tp > 1 or loss != "loss-parallel" else "unfused",  # DTensor's needs TP
                 },
    }
    if experts:
        data["plan"].update(_expert_plan(draw, experts, tp, cp, dp, preset == "deepseek-v3"))
        if zero >= 1:  # hybrid sharding splits the expert-DP group too (validation rejects what it cannot split)
            data["plan"]["dp_replicate"] = draw(st.sampled_from([1, 1, 2]))
    return data


def _expert_plan(draw, experts, tp, cp, dp, shared):
    """ep, etp and plan.moe for an MoE model: Megatron-Core's folded layout or, sometimes,
    the 0.9 one (EP inside DP, etp = tp)."""
    folding = draw(st.sampled_from([True, True, False]))
    etp = draw(st.sampled_from(sorted({1, tp}))) if folding else tp
    room = tp * cp * dp // etp if folding else dp
    ep = draw(st.sampled_from([e for e in _divisors(experts) if room % e == 0 and e <= 64]))
    capacity = draw(st.sampled_from([None, None, 1.0, 1.25]))
    # DeepEP and Hybrid-EP too (validation refuses the groups and placements they cannot run)
    moe = {"folding": folding, "dispatcher": draw(st.sampled_from(["alltoall", "alltoall", "allgather", "deepep",
                                                                   "hybridep"])),
           "capacity_factor": capacity, "pad_to_capacity": capacity is not None and draw(st.booleans()),
           "load_imbalance": draw(st.sampled_from([1.0, 1.0, 1.3])),
           "ep_comm_overlap": ep > 1 and draw(st.booleans()),
           "shared_expert_overlap": shared and draw(st.booleans()), "grouped_gemm": draw(st.booleans()),
           # Megatron-Core 0.13's placement of the router's probabilities, or the one before
           "probs_in_experts": draw(st.booleans())}
    return {"ep": ep, "etp": etp, "moe": moe}


def scenario_of(data):
    try:
        return scenario_from_dict(data)
    except InputError:
        assume(False)
