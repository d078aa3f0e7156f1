"""The small dense model and plan of the attention-band tests (sliding windows, packed documents)."""

from simulator import scenario_from_dict
from simulator.workload import ATTENTION_CORE, Shard, layer_ops

# GPT-2-sized MHA model, RoPE, no dropout: attention core width q = o = h
DENSE = {"layers": 4, "hidden": 1024, "heads": 16, "ffn_hidden": 4096, "vocab": 32000, "seq_len": 4096,
         "activation": "swiglu", "bias": False, "position_embedding": "rope", "norm": "rmsnorm", "dropout": False}


def scenario(model, **plan):
    return scenario_from_dict({"model": model, "cluster": {"node": "dgx-h100", "nodes": 1},
                               "plan": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 8, **plan}})


def attention_fwd_flops(model, cp: int) -> float:
    """Forward FLOPs of one layer's attention core on one of `cp` context-parallel ranks."""
    ops = layer_ops(model, Shard(micro_batch=1, seq_len=model.seq_len, cp=cp))
    return sum(op.fwd_flops for op in ops if op.group == ATTENTION_CORE)
