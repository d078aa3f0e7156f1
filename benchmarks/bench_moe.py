"""How long one evaluation of an MoE plan takes (issue 11: as fast as a dense one; analytic
<= 3 ms, graph <= 50 ms for DeepSeek-V3 on 1024 H100). Run: python benchmarks/bench_moe.py

DeepSeek-V3 without its MTP module (llmsim refuses MTP) and with 64 layers in place of 61
(so that 16 pipeline stages hold equal layers, as llmsim requires): PP16 EP64 TP1, the
DeepSeek-V3 report's mapping (arXiv 2412.19437 Sec. 3.2), on 128 DGX H100 nodes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_engine import best_ms  # noqa: E402  (benchmarks/ is on the path of a script run from it)
from simulator import evaluate, scenario_from_dict  # noqa: E402

DEEPSEEK = {"model": {"preset": "deepseek-v3", "mtp_layers": 0, "layers": 64},
            "cluster": {"node": "dgx-h100", "nodes": 128},
            "plan": {"tp": 1, "pp": 16, "ep": 64, "micro_batch": 1, "global_batch": 4096, "zero_stage": 1,
                     "recompute": "full"}}
DENSE = {"model": {"preset": "llama-3.1-70b"}, "cluster": {"node": "dgx-h100", "nodes": 128},
         "plan": {"tp": 8, "pp": 16, "micro_batch": 1, "global_batch": 4096, "zero_stage": 1,
                  "sequence_parallel": True}}


def main() -> None:
    print(f"{'case':40s} {'analytic min/median ms':>24s} {'graph min/median ms':>22s}")
    deepep = {**DEEPSEEK, "plan": {**DEEPSEEK["plan"], "moe": {"dispatcher": "deepep"}}}
    for label, data in (("deepseek-v3 (64 layers) 1024 H100", DEEPSEEK), ("the same with DeepEP", deepep),
                        ("llama-3.1-70b 1024 H100", DENSE)):
        s = scenario_from_dict(data)
        a = best_ms(lambda: evaluate(s, "analytic"), 200)
        g = best_ms(lambda: evaluate(s, "graph"), 15)
        print(f"{label:40s} {a[0]:11.2f} / {a[1]:8.2f} {g[0]:11.2f} / {g[1]:8.2f}")


if __name__ == "__main__":
    main()
