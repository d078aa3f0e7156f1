#!/usr/bin/env bash
# Calibrate llmsim on one CUDA machine and validate the profile against real training steps.
#
#   benchmarks/gpu_check.sh [NAME]        (from the repository root or anywhere in it)
#
# Needs a CUDA build of torch in the environment (the project pins the CPU build; install the
# CUDA wheel of the same version, e.g. `pip install torch==2.13.0 --index-url
# https://download.pytorch.org/whl/cu128`). Writes
#   hardware_profiles/calibrated/NAME.yaml (+ NAME-node.yaml, NAME-net.yaml)
#   docs/calibration/validate-torch-NAME.json
# and takes under 6 minutes on one GPU (each step is bounded by `timeout`): bf16, fp16, fp32
# and, on compute capability >= 8.9, fp8 GEMMs; SDPA (flash) attention forward and backward;
# memory-bound and framework kernels; host<->device copies; NCCL all-reduce when more than one
# GPU is present (else gloo between two CPU processes stands in); then the CUDA grid of
# simulator/calibrate/validate_torch.py (bf16 GPT steps, DP=2 rows only with two GPUs).
set -euo pipefail

cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
NAME="${1:-cuda-$(hostname -s | tr -c 'A-Za-z0-9_\n-' '-')}"
PROFILE="hardware_profiles/calibrated/${NAME}.yaml"
REPORT="docs/calibration/validate-torch-${NAME}.json"

"$PY" - <<'EOF' || exit 2
import sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"no CUDA device visible to torch {torch.__version__} (CUDA build: {torch.version.cuda}); "
             "install a CUDA build of torch==2.13.0")
p = torch.cuda.get_device_properties(0)
print(f"{torch.cuda.device_count()} x {p.name}, compute capability {p.major}.{p.minor}, "
      f"{p.total_memory / 2**30:.0f} GiB; torch {torch.__version__}, CUDA {torch.version.cuda}")
EOF

start=$(date +%s)
echo "== calibrate (at most 4 minutes) -> ${PROFILE}"
timeout 240 "$PY" -m simulator.cli calibrate --device cuda -o "${PROFILE}"
echo "== validate --torch (at most 2 minutes) -> ${REPORT}"
timeout 120 "$PY" -m simulator.cli validate --torch --device cuda --profile "${PROFILE}" --json > "${REPORT}"
"$PY" - "${REPORT}" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(f"  {r['config']:34s} measured {1e3 * r['measured_step_s']:8.1f} ms (noise {r['noise_pct']:4.1f}%), "
          f"predicted {1e3 * r['predicted_step_s']:8.1f} ms ({r['step_error_pct']:+.1f}%); memory "
          f"{r['memory_error_pct']:+.1f}%")
print(f"step-time MAPE {d['mape_pct']:.1f}% (worst row {d['max_abs_error_pct']:.1f}%), memory MAPE "
      f"{d['memory_mape_pct']:.1f}%, median noise {d['median_noise_pct']:.1f}%")
EOF
echo "done in $(( $(date +%s) - start )) s: ${PROFILE}, ${REPORT}"
