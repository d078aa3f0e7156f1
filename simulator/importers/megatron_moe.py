"""Megatron-Core's Mixture-of-Experts, latent-attention and multi-token-prediction settings, as
a Megatron-LM launch script and a NeMo (Megatron) YAML give them.

Both name them after Megatron-Core's TransformerConfig fields (NVIDIA/Megatron-LM@d98e8a64dd
megatron/core/transformer/transformer_config.py; megatron.py's megatron_key and nemo_key spell
them as each source does). Defaults are
Megatron-Core's: top-2 routing, the all-gather token dispatcher, experts as wide as
--ffn-hidden-size, the expert tensor-parallel size equal to the tensor-parallel size
(arguments.py validate_args), every layer MoE.

- num_moe_experts, moe_router_topk, moe_ffn_hidden_size -> model.experts, top_k,
  expert_ffn_hidden; moe_shared_expert_intermediate_size (the total width of the shared
  experts, transformer_config.py) -> one shared expert of that width (its parameters and
  FLOPs are those of n experts of width/n);
- moe_layer_freq: an integer N (layer i is MoE when i % N == 0) or a pattern such as
  "([0]*3+[1]*58)" or Llama 4 Maverick's "([0,1]*24)" (arguments.py moe_freq_type), expressed
  as leading dense layers, a frequency and the place in it (model.dense_layers,
  moe_layer_freq, moe_layer_offset) or refused;
- expert_model_parallel_size, expert_tensor_parallel_size -> plan.ep, plan.etp;
- moe_token_dispatcher_type (alltoall | allgather | flex with moe_flex_dispatcher_backend
  deepep or hybridep, or moe_enable_deepep -> deepep), moe_expert_capacity_factor,
  moe_pad_expert_input_to_capacity, moe_shared_expert_overlap,
  overlap_moe_expert_parallel_comm -> plan.moe; moe_flex_dispatcher_num_sms (or the backend's
  moe_deepep_num_sms / moe_hybridep_num_sms) -> plan.moe.dispatcher_sms; the flex dispatcher's
  NCCL EP backend and the older alltoall_seq are refused;
- moe_router_num_groups, moe_router_group_topk -> model.router_groups, router_group_topk
  (group-limited routing: what DeepEP sends depends on it);
- moe_grouped_gemm -> plan.moe.grouped_gemm; absent, Megatron-Core's default (False:
  SequentialMLP, one launch per local expert's GEMM, moe.py);
- multi_latent_attention with q_lora_rank (None: a full-rank query), kv_lora_rank,
  qk_head_dim, qk_pos_emb_head_dim, v_head_dim (arguments.py _add_mla_args defaults 32,
  128, 64, 128) -> model.attention mla; mtp_num_layers -> model.mtp_layers.

The router's load-balancing loss, score function and numerics change which experts a token
picks, not what a step costs (llmsim routes balanced unless plan.moe.load_imbalance says
otherwise); they are listed as ignored.
"""

from __future__ import annotations

import ast
from typing import Callable

from ..deepep import BACKENDS as DEEPEP_BACKENDS
from ..moe import DISPATCHERS
from .common import Account

# Router and expert numerics: which experts a token picks, not the cost of a step.
IGNORED_MOE = ("router-load-balancing-type", "aux-loss-coeff", "z-loss-coeff", "router-score-function",
               "router-enable-expert-bias", "router-bias-update-rate", "router-topk-scaling-factor",
               "router-pre-softmax", "router-dtype", "input-jitter-eps",
               "token-drop-policy", "per-layer-logging", "router-force-load-balancing", "use-upcycling",
               "upcycling-granularity", "apply-probs-on-input", "use-legacy-grouped-gemm", "token-dropping")
MOE_REASONS = {
    "permute-fusion": "kernel fusion is not modelled (efficiencies are the profile's)",
    "router-fusion": "kernel fusion is not modelled (efficiencies are the profile's)",
    "shared-expert-gate": "the shared experts' sigmoid gate (hidden x 1 weights) is not counted",
}


def ignored(key: Callable[[str], str]) -> tuple:
    """fnmatch patterns of the router numerics, in the source's spelling."""
    return tuple(key("moe_" + k.replace("-", "_")) for k in IGNORED_MOE)


def reasons(key: Callable[[str], str]) -> dict:
    """fnmatch patterns of MoE keys llmsim reads differently, with why, in the source's spelling."""
    return {key("moe_" + k.replace("-", "_")): why for k, why in MOE_REASONS.items()}


def read_moe(a: Account, key: Callable[[str], str], number: Callable, layers: int, ffn_hidden: int) -> None:
    """Map the MoE, MLA and MTP settings of `a` (keys spelled by `key`, numbers read by
    `number(a, key, default)`) into a.scenario; nothing when the model has no experts, MLA or
    MTP."""
    _mla(a, key, number)
    if a.has(key("mtp_num_layers")):
        a.map(key("mtp_num_layers"), "model.mtp_layers", number(a, key("mtp_num_layers"), 0))
    experts = number(a, key("num_moe_experts"), 0)
    if not experts:  # a dense model: its MoE and expert-parallel settings do nothing
        a.ignore(*(k for k in a.flat if k.startswith((key("moe_"), key("expert_")))))
        return
    a.map(key("num_moe_experts"), "model.experts", experts)
    a.map(key("moe_router_topk"), "model.top_k", number(a, key("moe_router_topk"), 2))
    a.map(key("moe_ffn_hidden_size"), "model.expert_ffn_hidden", number(a, key("moe_ffn_hidden_size"), ffn_hidden))
    shared = number(a, key("moe_shared_expert_intermediate_size"), None)
    if shared:
        a.map(key("moe_shared_expert_intermediate_size"), "model.shared_experts", 1)
        a.map(key("moe_shared_expert_intermediate_size"), "model.shared_expert_ffn_hidden", shared)
    _layer_freq(a, key("moe_layer_freq"), layers)
    a.map(key("expert_model_parallel_size"), "plan.ep", number(a, key("expert_model_parallel_size"), 1))
    if a.has(key("expert_tensor_parallel_size")):
        a.map(key("expert_tensor_parallel_size"), "plan.etp", number(a, key("expert_tensor_parallel_size")))
    elif number(a, key("context_parallel_size"), 1) > 1:
        # the version decides where the EP group lies once CP > 1, and the source does not say it
        a.absent(key("expert_tensor_parallel_size"), "MoE parallel folding assumed (Megatron-Core 0.10 on: EP x ETP "
                 "carved out of TP x CP x DP); Megatron-Core 0.9 (NeMo 24.09) carves EP out of DP: "
                 "--set plan.moe.folding=false")
    dispatcher = _dispatcher(a, key)
    a.map(key("moe_token_dispatcher_type"), "plan.moe.dispatcher", dispatcher)
    a.absent("Megatron-Core release", "taken as 0.13 or later, whose experts' activation takes the router's "
             "probabilities and whose un-permutation keeps no copies of the expert outputs (moe.py); before "
             "0.13: --set plan.moe.probs_in_experts=false")
    a.used(key("moe_flex_dispatcher_backend"), key("moe_enable_deepep"))
    if dispatcher in DEEPEP_BACKENDS:  # its SMs: moe_flex_dispatcher_num_sms, else the backend's own (deprecated) knob
        for sms_key in (key("moe_flex_dispatcher_num_sms"), key(f"moe_{dispatcher}_num_sms")):
            sms = number(a, sms_key, None)
            if sms:
                a.map(sms_key, "plan.moe.dispatcher_sms", sms)
                break
    a.used(key("moe_flex_dispatcher_num_sms"), key("moe_deepep_num_sms"), key("moe_hybridep_num_sms"))
    groups = number(a, key("moe_router_num_groups"), None)
    if groups and groups > 1:
        topk = number(a, key("moe_router_group_topk"), None)
        if not topk:
            a.refuse(key("moe_router_num_groups"), "needs moe_router_group_topk (the groups a token's experts "
                                                  "come from)")
        a.map(key("moe_router_num_groups"), "model.router_groups", groups)
        a.map(key("moe_router_group_topk"), "model.router_group_topk", topk)
    a.used(key("moe_router_num_groups"), key("moe_router_group_topk"))
    capacity = number(a, key("moe_expert_capacity_factor"), None, integer=False)
    if capacity is not None and capacity > 0:
        a.map(key("moe_expert_capacity_factor"), "plan.moe.capacity_factor", capacity)
        if a.get(key("moe_pad_expert_input_to_capacity")):
            a.map(key("moe_pad_expert_input_to_capacity"), "plan.moe.pad_to_capacity", True)
    a.used(key("moe_expert_capacity_factor"), key("moe_pad_expert_input_to_capacity"))
    a.map(key("moe_grouped_gemm"), "plan.moe.grouped_gemm", bool(a.get(key("moe_grouped_gemm"), False)))
    for field, option in (("moe_shared_expert_overlap", "shared_expert_overlap"),
                          ("overlap_moe_expert_parallel_comm", "ep_comm_overlap"),
                          ("moe_router_padding_for_quantization", "router_padding"),
                          ("moe_router_padding_for_fp8", "router_padding")):
        if a.get(key(field)):
            a.map(key(field), f"plan.moe.{option}", True)
        a.used(key(field))
    for field, why in (("moe_latent_size", "MoE latent projections are not modelled"),
                       ("moe_extended_tp", "extended tensor parallelism of the experts is not modelled")):
        if a.get(key(field)):
            a.refuse(key(field), why)


def _dispatcher(a: Account, key) -> str:
    """plan.moe.dispatcher: alltoall or allgather by name; the flex dispatcher by its backend
    (transformer_config.py: moe_flex_dispatcher_backend, deepep by default, or hybridep; the
    deprecated moe_enable_deepep: deepep). The backend is read only under flex, as Megatron-Core does (and
    Megatron-Bridge, whose recipes name a backend that apply_flex_dispatcher_backend switches on)."""
    dispatcher = str(a.get(key("moe_token_dispatcher_type"), "allgather"))
    backend = key("moe_flex_dispatcher_backend")
    if dispatcher == "flex":
        name = str(a.get(backend, "deepep"))
        if name not in DEEPEP_BACKENDS:
            a.refuse(backend, "modelled: deepep (DeepEP's normal kernels), hybridep; not NCCL EP")
        return name
    if a.get(key("moe_enable_deepep")):
        a.refuse(key("moe_enable_deepep"), "needs moe_token_dispatcher_type flex (Megatron-Core refuses it otherwise)")
    if dispatcher not in DISPATCHERS:
        a.refuse(key("moe_token_dispatcher_type"), "modelled: alltoall, allgather, flex with DeepEP or Hybrid-EP "
                                                   "(not the older alltoall_seq)")
    return dispatcher


def _mla(a: Account, key, number) -> None:
    """Multi-latent attention: every head has its own decompressed K and V (kv_heads = heads)."""
    if not a.get(key("multi_latent_attention")):
        return
    a.map(key("multi_latent_attention"), "model.attention", "mla")
    a.map(key("num_attention_heads"), "model.kv_heads", a.scenario["model"]["heads"])
    for field, dotted, default in (("q_lora_rank", "q_lora_rank", None), ("kv_lora_rank", "kv_lora_rank", 32),
                                   ("qk_head_dim", "qk_nope_head_dim", 128),
                                   ("qk_pos_emb_head_dim", "qk_rope_head_dim", 64),
                                   ("v_head_dim", "v_head_dim", 128)):
        a.map(key(field), f"model.{dotted}", number(a, key(field), default) or 0)


def _layer_freq(a: Account, k: str, layers: int) -> None:
    """moe_layer_freq as leading dense layers, a frequency and an offset (model.is_moe_layer)."""
    value = a.get(k, 1)
    text = str(value).strip()
    if text.isdigit() and int(text) >= 1:
        a.map(k, "model.moe_layer_freq", int(text))
        return
    pattern = pattern_list(text)
    if pattern is None or len(pattern) != layers or set(pattern) - {0, 1} or 1 not in pattern:
        a.refuse(k, f"expected a positive integer or a list expression of {layers} zeros and ones with at least one "
                    "one, such as ([0]*3+[1]*58)")
    period = layer_period(pattern)
    if period is None:
        a.refuse(k, "llmsim expresses leading dense layers followed by every n-th layer MoE, not this pattern")
    a.map(k, "model.dense_layers", period[0])
    a.map(k, "model.moe_layer_freq", period[1])
    if period[2]:
        a.map(k, "model.moe_layer_offset", period[2])


def layer_period(pattern: list):
    """(dense, n, offset) with pattern[i] = 1 exactly for i >= dense and i % n == offset
    (model.is_moe_layer), the smallest such n; None when no n fits. Leading zeros in
    (first - n, first], first where the ones begin, say the same: the fewest are taken."""
    first = pattern.index(1)
    for n in range(1, len(pattern) + 1):
        dense, offset = max(0, first - n + 1), first % n
        if pattern == [int(i >= dense and i % n == offset) for i in range(len(pattern))]:
            return dense, n, offset
    return None


def pattern_list(text: str):
    """The list a Megatron layer-pattern expression stands for (--moe-layer-freq,
    --window-attn-skip-freq): list literals of integers, `+` between lists and `*` by an integer
    (arguments.py moe_freq_type); None for anything else."""
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None

    def value(node):
        if isinstance(node, ast.List):
            items = [value(e) for e in node.elts]
            return items if all(isinstance(i, int) for i in items) else None
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
                return left + right
            if isinstance(node.op, ast.Mult):
                lst, n = (left, right) if isinstance(left, list) else (right, left)
                if isinstance(lst, list) and isinstance(n, int) and 0 <= n <= 100_000 and len(lst) * n <= 100_000:
                    return lst * n
        return None

    result = value(tree)
    return result if isinstance(result, list) else None
