"""Random valid plans for the property tests (hypothesis strategies): every schedule,
recompute mode (Megatron selective/full uniform/block, torchtitan op-level), precision (FP8
recipes on H100), TP overlap implementation, eager or compiled kernels, FSDP resharding,
uneven pipeline ranks.

Plans are built valid by construction where the rules are simple (divisors, batch
multiples) and the rest is left to plan validation; a draw the validation refuses is
rejected, not counted."""

from __future__ import annotations

from hypothesis import assume, strategies as st

from simulator import InputError, scenario_from_dict

MODELS = {  # preset, layers, query heads, kv heads
    "megatron-gpt-1.7b": (24, 24, 24),
    "llama-3.1-8b": (32, 32, 8),
    "llama-2-13b": (40, 40, 40),
}
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe-v")


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def plan_dicts(draw, zero_stages=(0, 1, 2, 3), offloads=True, max_seq_exp=15):
    """A scenario mapping with a random plan on 1-4 DGX nodes."""
    preset = draw(st.sampled_from(sorted(MODELS)))
    layers, heads, kv = MODELS[preset]
    node = draw(st.sampled_from(["dgx-a100", "dgx-h100"]))
    nodes = draw(st.sampled_from([1, 2, 4]))
    devices = 8 * nodes
    seq = 2 ** draw(st.integers(9, max_seq_exp))
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if heads % t == 0 and (kv % t == 0 or t % kv == 0)]))
    schedule = draw(st.sampled_from(SCHEDULES))
    chunks = {"zb-v": 2, "dualpipe-v": 2}.get(schedule, 1)
    vpp = draw(st.sampled_from([2, 3, 4])) if schedule == "interleaved" else 1
    chunks = vpp if schedule == "interleaved" else chunks
    pps = [p for p in _divisors(devices // tp) if layers % (p * chunks) == 0 and p <= 8]
    assume(pps)
    pp = draw(st.sampled_from(pps))
    cp = draw(st.sampled_from([c for c in (1, 2) if (devices // (tp * pp)) % c == 0]))
    dp = devices // (tp * pp * cp)
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
    recompute = draw(st.sampled_from(["none", "selective", "full", "op-selective"]))
    precision = draw(st.sampled_from(["bf16", "bf16", "fp32"] + (["fp8"] if node == "dgx-h100" else [])))
    extra = {"compile": draw(st.booleans()), "tp_overlap": draw(st.sampled_from(["userbuffers", "async-tp"])),
             "optimizer_precision": draw(st.sampled_from(["fp32", "bf16"]))}
    if recompute == "full":
        extra["recompute_method"] = draw(st.sampled_from(["uniform", "block"]))
        extra["recompute_num_layers"] = draw(st.sampled_from([1, 2, 3]))
    if precision == "fp8":
        extra["fp8_recipe"] = draw(st.sampled_from(["delayed", "tensorwise", "rowwise"]))
        extra["fp8_params"] = extra["fp8_recipe"] == "delayed" and draw(st.booleans())
    if flash:
        extra["attention_kernel"] = draw(st.sampled_from(["fused", "flash2"]))
    if zero == 3:
        extra["fsdp_reshard_after_forward"] = draw(st.booleans())
    even = layers // (pp * chunks) * chunks  # layers per rank
    if pp > 1 and even > chunks and draw(st.booleans()):  # uneven ranks: one chunk's layers moved
        extra.update(first_stage_layers=even - chunks, last_stage_layers=even + chunks)
    data = {
        "model": {"preset": preset, "seq_len": seq},
        "cluster": {"node": node, "nodes": nodes},
        "plan": {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "vpp": vpp, "schedule": schedule,
                 "micro_batch": micro_batch, "global_batch": micro_batch * dp * m,
                 "sequence_parallel": draw(st.booleans()), "recompute": recompute, "zero_stage": zero,
                 "offload": offload, "flash_attention": flash, "dp_overlap": draw(st.booleans()),
                 "tp_comm_overlap": draw(st.booleans()), "precision": precision, **extra,
                 },
    }
    return data


def scenario_of(data):
    try:
        return scenario_from_dict(data)
    except InputError:
        assume(False)
