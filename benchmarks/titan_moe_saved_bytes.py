"""What torchtitan's MoE layer keeps for its backward pass, measured on a CPU with torch.

    python benchmarks/titan_moe_saved_bytes.py --torchtitan PATH

PATH: a checkout of pytorch/torchtitan v0.2.2 (@73a0e6979). Runs its models/moe/moe.py MoE
layer in BF16 on one process (no expert parallelism: the permutation runs locally, through
indices_padding_wrapper) under torch.autograd.graph.saved_tensors_hooks, and prints the bytes of
every distinct storage autograd saves that is not a parameter, per configuration. Its
generate_permute_indices runs its CPU implementation (use_cpu=True; the Triton kernel needs a
GPU) and torch.histc counts the expert indices as floats (CPU histc takes no integers): the
same counts and indices. tests/test_titanmoe.py compares llmsim's count (titanmoe.py) with these
numbers.
"""

from __future__ import annotations

import argparse
import functools
import sys

# (experts, shared experts, top_k, score function, route_norm, score_before_experts)
CONFIGS = {"deepseek-like": (8, 1, 2, "sigmoid", True, False), "qwen3-like": (8, 0, 2, "softmax", True, False),
           "llama4-like": (8, 1, 1, "sigmoid", False, True)}
DIM, HIDDEN, BATCH, SEQ = 64, 32, 2, 16


def saved_bytes(torch, module, x) -> dict:
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = (storage.nbytes(), tuple(t.shape), str(t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x).sum().backward()
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torchtitan", required=True, help="a checkout of torchtitan v0.2.2")
    args = ap.parse_args()
    sys.path.insert(0, args.torchtitan)
    import torch
    from torchtitan.models.moe import moe, utils

    utils.generate_permute_indices = functools.partial(utils.generate_permute_indices, use_cpu=True)
    histc = torch.histc  # CPU histc takes no integer input; the counts are the same (nothing saved)
    torch.histc = lambda t, *a, **k: histc(t.float(), *a, **k).to(t.dtype)
    torch.manual_seed(0)
    for name, (experts, shared, top_k, score, norm, before) in CONFIGS.items():
        moe_args = moe.MoEArgs(num_experts=experts, num_shared_experts=shared, top_k=top_k, score_func=score,
                               route_norm=norm, score_before_experts=before)
        layer = moe.MoE(moe_args, dim=DIM, hidden_dim=HIDDEN)
        with torch.no_grad():
            layer.init_weights(0.02, torch.device("cpu"))
        layer = layer.to(torch.bfloat16)
        layer.expert_bias = layer.expert_bias.float()  # buffers stay fp32 as in torchtitan's FSDP mixed precision
        x = torch.randn(BATCH, SEQ, DIM, dtype=torch.bfloat16, requires_grad=True)
        seen = saved_bytes(torch, layer, x)
        print(f"{name}: {sum(n for n, _, _ in seen.values())} bytes saved "
              f"(T={BATCH * SEQ}, h={DIM}, f={HIDDEN}, E={experts}, k={top_k}, shared={shared})")
        for n, shape, dtype in sorted(seen.values(), key=lambda v: -v[0]):
            print(f"  {n:8d}  {dtype:15s} {shape}")


if __name__ == "__main__":
    main()
