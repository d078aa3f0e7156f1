"""MoE dispatch and combine against a published microbenchmark: Hybrid-EP's and DeepEP's kernels on
a DGX B200 and in a GB200 NVL72 rack (data/microbenchmarks/hybridep-dispatch.yaml, from
deepseek-ai/DeepEP@94a9f8f6 branch hybrid-ep docs/README_Hybrid-EP.md).

The benchmark sends 4096 tokens a rank, hidden 7168 in BF16, each to the ranks of its top-8
experts (8 a rank, routed uniformly at random), and reports per rank the bytes of the tokens the
rank receives over the time of one call, through the Python API and, for Hybrid-EP, of the kernel
alone. llmsim predicts one such call with deepep.comm_s (half of its dispatch-plus-combine, the two
moving the same rows) on the node's profile, and the benchmark's bytes with the same expected
destinations (deepep.layout); nothing is fitted to the table.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from ..comm import Placement
from ..deepep import comm_s, layout
from ..hardware import cluster_from_dict
from ..model import model_from_dict
from ..moe import ExpertShard, MoEOptions
from .te_gemm_bench import load_table

TABLE = "hybridep-dispatch.yaml"
CALLS = ("dispatch", "combine")


def predicted_bandwidth(table: dict, run: dict) -> float:
    """The benchmark's GB/s for one call as llmsim predicts it: the received tokens' bytes over
    the predicted one-way time."""
    n, tokens, hidden = run["ranks"], table["tokens_per_rank"], table["hidden"]
    model = model_from_dict({"layers": 1, "hidden": hidden, "heads": hidden // 128, "vocab": 1024,
                             "seq_len": tokens, "activation": "swiglu", "experts": table["experts_per_rank"] * n,
                             "top_k": table["top_k"], "expert_ffn_hidden": 2048})
    node = cluster_from_dict({"node": run["node"], "nodes": 1})
    cluster = replace(node, nodes=-(-n // node.devices_per_node))
    local = min(n, cluster.scaleup_domain)
    groups = SimpleNamespace(ep_etp=Placement(n, local, -(-n // local)))
    experts = ExpertShard(n, 1, MoEOptions(dispatcher=run["backend"], dispatcher_sms=run["sms"]))
    shard = SimpleNamespace(act_bytes=2, replicated_tokens=tokens)
    one_way = float(comm_s(model, shard, experts, groups, cluster)) / 2
    _, _, _, ranks, _ = layout(model, experts, groups)
    return tokens * float(ranks) * hidden * 2 / one_way / 1e9


def report(table: dict | None = None) -> list[dict]:
    """One row a run, call and API: measured and predicted GB/s, and the error of the predicted
    time (predicted over measured, less one; negative: predicted faster)."""
    table = load_table(TABLE) if table is None else table
    rows = []
    for run in table["runs"]:
        predicted = predicted_bandwidth(table, run)
        for api in ("torch", "kernel"):
            for call, measured in zip(CALLS, run.get(api, ())):
                rows.append({"node": run["node"], "backend": run["backend"], "ranks": run["ranks"], "sms": run["sms"],
                             "call": call, "api": api, "measured_gb_per_s": measured,
                             "predicted_gb_per_s": predicted, "error_pct": 100 * (measured / predicted - 1)})
    return rows
