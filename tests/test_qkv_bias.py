"""Biases on the query, key and value projections alone (model.qkv_bias: Qwen2, GLM-4.5;
Megatron --add-qkv-bias with --disable-bias-linear): their parameters, held split over the TP
ranks like the projections, and their gradients reduced over the tokens."""

from pathlib import Path

import pytest
import yaml

from simulator import InputError
from simulator.framework_ops import layer_framework_ops, param_tensors
from simulator.importers import import_config
from simulator.model import load_hf_config, model_from_dict
from simulator.plan import Plan
from simulator.states import bytes_per_param, layer_params_local
from simulator.workload import Shard

HF = Path(__file__).parent / "data" / "hf"
DATA = Path(__file__).parent / "data" / "imports"
MODEL = {"preset": "llama-3.1-8b", "seq_len": 4096}


def test_qwen2_7b_counts_its_qkv_biases_as_published():
    # by hand: 28 layers of 3584 x (3584 + 2 x 512) + 3584 x 3584 attention with 3584 + 2 x 512
    # q/k/v biases, SwiGLU 3 x 3584 x 18944 and two norms; untied 152064 x 3584 tables and the
    # final norm (without the biases 7,615,487,488)
    m = load_hf_config(str(HF / "qwen2-7b.json"), seq_len=4096)
    layer = 3584 * (3584 + 1024) + 3584 * 3584 + 3584 + 1024 + 3 * 3584 * 18944 + 2 * 3584
    assert (m.qkv_bias, m.bias) == (True, False)
    assert m.params() == 28 * layer + 2 * 152064 * 3584 + 3584 == 7_615_616_512


def test_a_tp_rank_holds_its_share_of_the_qkv_biases():
    # Llama 3.1 8B's shape at tp 2: 16 query heads and 4 KV heads of 128 per rank
    assert layer_params_local(model_from_dict({**MODEL, "qkv_bias": True}), 2) - \
        layer_params_local(model_from_dict(MODEL), 2) == 16 * 128 + 2 * 4 * 128


def test_the_qkv_biases_gradient_reads_the_projections_output_gradient():
    model = model_from_dict({**MODEL, "qkv_bias": True})
    shard = Shard(micro_batch=1, seq_len=4096, tp=2)
    ops = {op.name: op for op in layer_framework_ops(model, Plan(), shard, bytes_per_param("bf16", "fp32"))}
    assert ops["bias_grad"].bwd_input_bytes == 2 * 4096 * (16 + 2 * 4) * 128  # bf16, 4096 tokens
    assert param_tensors(model, 32, True, True, True) - param_tensors(model_from_dict(MODEL), 32, True, True,
                                                                       True) == 32


@pytest.mark.parametrize("fields", [{"qkv_bias": True, "bias": True}, {"preset": "deepseek-v3", "qkv_bias": True}])
def test_qkv_biases_beside_every_linears_biases_or_latent_attention_are_refused(fields):
    with pytest.raises(InputError) as e:
        model_from_dict({**MODEL, **fields})
    assert e.value.field == "model.qkv_bias"


@pytest.mark.parametrize("key", ["attention_bias", "mlp_bias"])
def test_a_llamas_other_partial_biases_are_refused(tmp_path, key):
    import json
    cfg = json.loads((HF / "llama-3.1-8b.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, key: True}))
    with pytest.raises(InputError) as e:
        load_hf_config(str(path), seq_len=4096)
    assert e.value.field.endswith("." + key)


def test_megatron_add_qkv_bias_without_linear_biases_is_the_qkv_bias(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text("torchrun pretrain_gpt.py --num-layers 28 --hidden-size 3584 --num-attention-heads 28 "
                    "--group-query-attention --num-query-groups 4 --seq-length 4096 --micro-batch-size 1 "
                    "--global-batch-size 64 --bf16 --disable-bias-linear --add-qkv-bias\n")
    model = import_config("megatron", path, {"cluster.node": "dgx-h100"}).scenario["model"]
    assert (model["bias"], model["qkv_bias"]) == (False, True)


def test_megatron_bridges_add_qkv_bias_is_the_qkv_bias(tmp_path):
    data = yaml.safe_load((DATA / "bridge-llama3_8b_sft_gb200_fp8_mx_v1.yaml").read_text())
    data["model"].update(add_bias_linear=False, add_qkv_bias=True)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    model = import_config("megatron", path, {"cluster.node": "dgx-b200"}).scenario["model"]
    assert (model["bias"], model["qkv_bias"]) == (False, True)
