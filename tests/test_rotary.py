"""Partial RoPE (model.rotary_fraction): RoPE rotates a share of each query and key head and
passes the rest through (GLM-4.5, Phi-4-mini; Megatron --rotary-percent). The fused kernel
reads and writes every element either way (TransformerEngine's fused_rope_block_forward
copies the rest in the same kernel), so the operator's bytes are full RoPE's; eager PyTorch's
slices and concatenation are refused."""

import json
from pathlib import Path

import pytest
import yaml

from simulator import InputError, scenario_from_dict
from simulator.importers import import_config
from simulator.model import load_hf_config, model_from_dict
from simulator.workload import Shard, layer_ops

DATA = Path(__file__).parent / "data" / "imports"
MODEL = {"preset": "llama-3.1-8b", "seq_len": 4096}


def _rope(**fields):
    ops = layer_ops(model_from_dict({**MODEL, **fields}), Shard(micro_batch=1, seq_len=4096, tp=2))
    return {op.name: op for op in ops}["rope"]


def test_a_partial_rope_moves_the_bytes_of_full_rope():
    full, half = _rope(), _rope(rotary_fraction=0.5)
    # bf16 read and write of every local query and key element: 4096 x (16 + 4) x 128
    assert half.fwd_bytes == full.fwd_bytes == 2 * 2 * 4096 * (16 + 4) * 128
    assert half.bwd_input_bytes == full.bwd_input_bytes


@pytest.mark.parametrize("fields", [{"rotary_fraction": 0.3},  # 38.4 of 128 dimensions
                                    {"rotary_fraction": 0.5, "position_embedding": "learned"},
                                    {"rotary_fraction": 0.0}, {"rotary_fraction": 1.5}])
def test_a_rotary_fraction_no_model_has_is_refused(fields):
    with pytest.raises(InputError) as e:
        model_from_dict({**MODEL, **fields})
    assert e.value.field == "model.rotary_fraction"


def test_latent_attention_states_its_rotated_part_itself():
    with pytest.raises(InputError) as e:
        model_from_dict({"preset": "deepseek-v3", "rotary_fraction": 0.5})
    assert e.value.field == "model.rotary_fraction"


def test_eager_partial_rope_is_refused():
    with pytest.raises(InputError) as e:
        scenario_from_dict({"model": {**MODEL, "rotary_fraction": 0.5}, "cluster": {"node": "dgx-h100"},
                            "plan": {"tp": 1, "dp": 8, "micro_batch": 1, "global_batch": 8, "compile": False}})
    assert e.value.field == "plan.compile"


def test_phi4_minis_partial_rotary_factor_is_the_rotary_fraction(tmp_path):
    # microsoft/Phi-4-mini-instruct: 24 heads of 128, RoPE on 96 dimensions of each
    cfg = {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
           "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 200064, "hidden_act": "silu",
           "partial_rotary_factor": 0.75, "tie_word_embeddings": True}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert load_hf_config(str(path), seq_len=4096).rotary_fraction == 0.75


def test_megatrons_rotary_percent_is_the_rotary_fraction(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text("torchrun pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
                    "--seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 "
                    "--position-embedding-type rope --rotary-percent 0.5\n")
    imported = import_config("megatron", path, {"cluster.node": "dgx-h100"})
    assert imported.scenario["model"]["rotary_fraction"] == 0.5
    assert "rotary-percent" not in {u["key"] for u in imported.unmapped}


def test_megatron_bridges_rotary_percent_is_the_rotary_fraction(tmp_path):
    data = yaml.safe_load((DATA / "bridge-llama3_8b_sft_gb200_fp8_mx_v1.yaml").read_text())
    data["model"]["rotary_percent"] = 0.5
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    assert import_config("megatron", path, {"cluster.node": "dgx-b200"}).scenario["model"]["rotary_fraction"] == 0.5
