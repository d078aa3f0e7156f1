"""What PyTorch's caching allocator keeps reserved beyond the live tensors at the loss
(allocator.py): the loss's allocations replayed under the allocator's rules, by hand, and the
reserved peak a scenario reports."""

import pytest

from simulator import allocator
from simulator.evaluate import compile_scenario, evaluate
from simulator.scenario import scenario_from_dict

N = 1000  # logits: the replay works in bytes per logit


class BestFit:
    """The caching allocator's rules as CUDACachingAllocator.cpp states them, written out: a
    request takes the smallest free block that holds it (lowest address on a tie) and splits
    it; a freed block merges with free neighbours; with no block large enough the segment
    grows at its end, taking a free block that ends it."""

    def __init__(self):
        self.blocks = []  # [size, free, name] in address order
        self.gaps = []  # reserved minus allocated after each request

    def alloc(self, name, size):
        fits = [b for b in self.blocks if b[1] and b[0] >= size]
        if fits:
            block = min(fits, key=lambda b: b[0])
            i = self.blocks.index(block)
            if block[0] > size:
                self.blocks.insert(i + 1, [block[0] - size, True, None])
            self.blocks[i] = [size, False, name]
        elif self.blocks and self.blocks[-1][1]:
            self.blocks[-1] = [size, False, name]
        else:
            self.blocks.append([size, False, name])
        self.gaps.append(sum(b[0] for b in self.blocks if b[1]))

    def free(self, name):
        i = next(i for i, b in enumerate(self.blocks) if b[2] == name)
        self.blocks[i] = [self.blocks[i][0], True, None]
        merged = []
        for b in self.blocks:
            if merged and merged[-1][1] and b[1]:
                merged[-1] = [merged[-1][0] + b[0], True, None]
            else:
                merged.append(b)
        self.blocks = merged


def replay(act_bytes, loss="unfused", logits_held=False):
    """Free bytes when the loss's backward takes its last logits-sized buffer: PyTorch's
    cross_entropy(pred.float()) (log_softmax saved; nll_loss_backward's zeros, then
    _log_softmax_backward_data's result) or DTensor's loss-parallel log-softmax (upcast, shifted,
    exp freed after its sum, result saved; backward zeros, exp, product), after the layers'
    activations."""
    a = BestFit()
    a.alloc("activations", 50 * N)
    a.alloc("logits", act_bytes * N)
    upcast = act_bytes < 4  # .float() of fp32 logits is the tensor itself
    if upcast:
        a.alloc("upcast", 4 * N)
    if loss == "unfused":
        a.alloc("saved", 4 * N)
    elif loss == "vocab-parallel":
        a.free("upcast")  # Megatron: the upcast is the saved softmax, renamed
        a.alloc("saved", 4 * N)
        upcast = False
    else:
        a.alloc("shifted", 4 * N)
        a.alloc("exp", 4 * N)
        a.free("exp")
        a.alloc("saved", 4 * N)
        a.free("shifted")
    if upcast:
        a.free("upcast")
    if not logits_held:
        a.free("logits")  # torchtitan: del pred
    if loss == "vocab-parallel":  # the gradient in the softmax's buffer; autograd's 16-bit copy
        a.alloc("grad16", act_bytes * N)
        return a.gaps[-1]
    for name in ("grad", "grad2") if loss == "unfused" else ("zeros", "exp2", "product"):
        a.alloc(name, 4 * N)
    return a.gaps[-1]


def shard_and_plan(precision="bf16", loss="unfused", pp=1, pp_impl="megatron", tp=1):
    s = scenario_from_dict({"model": {"preset": "llama-3.1-8b", "seq_len": 4096},
                            "cluster": {"node": "dgx-h100", "nodes": 4},
                            "plan": {"tp": tp, "pp": pp, "pp_impl": pp_impl, "micro_batch": 1,
                                     "global_batch": 64, "precision": precision, "loss": loss,
                                     "recompute": "full"}})
    layout = compile_scenario(s)
    return s.model, layout.shard, s.plan


@pytest.mark.parametrize("loss", ["unfused", "loss-parallel"])
def test_replayed_16_bit_loss_leaves_its_logits_block_free_at_the_peak(loss):
    assert replay(2, loss) == 2 * N
    model, shard, plan = shard_and_plan(loss=loss, tp=2 if loss == "loss-parallel" else 1)
    logits = shard.tokens * model.vocab / shard.tp
    assert allocator.loss_free_bytes(model, shard, plan) == pytest.approx(replay(2, loss) / N * logits)


def test_megatrons_in_place_loss_leaves_no_free_block():
    assert replay(2, "vocab-parallel") == 0
    assert allocator.loss_free_bytes(*shard_and_plan(loss="vocab-parallel")) == 0


def test_fp32_logits_leave_no_free_block_their_gradient_could_not_take():
    assert replay(4) == 0
    model, shard, plan = shard_and_plan(precision="fp32")
    assert allocator.loss_free_bytes(model, shard, plan) == 0


def test_logits_a_torch_pipeline_keeps_until_the_backward_leave_no_free_block():
    assert replay(2, logits_held=True) == 0
    assert allocator.loss_free_bytes(*shard_and_plan(pp=2, pp_impl="torch")) == 0
    model, shard, plan = shard_and_plan(pp=2, pp_impl="megatron")  # frees its output once sent
    assert allocator.loss_free_bytes(model, shard, plan) == pytest.approx(2 * shard.tokens * model.vocab)


@pytest.mark.parametrize("loss", ["fused", "chunked"])
def test_losses_without_a_logits_tensor_leave_nothing(loss):
    assert allocator.loss_free_bytes(*shard_and_plan(loss=loss)) == 0


@pytest.mark.parametrize("engine", ["graph", "analytic"])
def test_reserved_peak_is_the_live_peak_plus_the_16_bit_logits_where_the_loss_peaks(engine):
    # 4,096 tokens x 128,256 logits: the loss's 12 B per logit (6.3 GB) outweigh a layer's rebuild
    s = scenario_from_dict({"model": {"preset": "llama-3.1-8b", "seq_len": 4096},
                            "cluster": {"node": "dgx-h100", "nodes": 1},
                            "plan": {"dp": 8, "micro_batch": 1, "global_batch": 8, "zero_stage": 3,
                                     "recompute": "full"}})
    r = evaluate(s, engine)
    assert r.peak_reserved_bytes - r.peak_memory_bytes == pytest.approx(2 * 4096 * 128256, rel=1e-9)
    assert r.to_dict()["peak_reserved_gib"] > r.to_dict()["peak_memory_gib"]
