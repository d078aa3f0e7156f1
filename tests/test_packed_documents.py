"""Packed documents (model.document_tokens): attention inside each document of a sequence."""

import pytest

from attention_bands import DENSE, attention_fwd_flops, scenario as _scenario
from simulator import InputError, evaluate
from simulator.domain import outside
from simulator.workload import model_flops_per_sequence, window_pair_fraction


def test_four_documents_per_sequence_attend_a_quarter_of_the_causal_half():
    # 4 documents of 1024: 4 x 1024²/2 = 2,097,152 pairs of 4096²/2 = 8,388,608
    assert window_pair_fraction(_scenario({**DENSE, "document_tokens": 1024}).model) == 0.25


def test_the_documents_remainder_is_a_shorter_document_of_its_own():
    # 4096 = 2 x 1500 + 1096: (2 x 1500² + 1096²) / 4096²
    model = _scenario({**DENSE, "document_tokens": 1500}).model
    assert window_pair_fraction(model) == pytest.approx((2 * 1500**2 + 1096**2) / 4096**2, rel=1e-15)


def test_a_sliding_window_slides_inside_each_document():
    # documents of 2048, window 1024: per document 2048 x 1024 - 1024²/2 = 1,572,864 pairs, two of
    # them: 3,145,728 / 8,388,608 = 0.375; the unwindowed layers attend their documents' 0.5
    every = _scenario({**DENSE, "document_tokens": 2048, "sliding_window": 1024}).model
    assert window_pair_fraction(every) == pytest.approx(0.375, rel=1e-15)
    alternate = _scenario({**DENSE, "document_tokens": 2048, "sliding_window": 1024, "sliding_window_freq": 2}).model
    assert window_pair_fraction(alternate) == pytest.approx((2 * 0.375 + 2 * 0.5) / 4, rel=1e-15)


def test_the_pairs_across_documents_leave_the_model_flops():
    # per layer and sequence the useful attention is 12·h FLOPs per pair: causal s²/2 pairs,
    # four documents of s/4 tokens 4 x (s/4)²/2
    s, d, h, layers = DENSE["seq_len"], 1024, DENSE["hidden"], DENSE["layers"]
    full = _scenario(DENSE).model
    packed = _scenario({**DENSE, "document_tokens": d}).model
    dropped = layers * 12 * h * (s * s / 2 - (s // d) * d * d / 2)
    assert model_flops_per_sequence(full) - model_flops_per_sequence(packed) == pytest.approx(dropped, rel=1e-12)


@pytest.mark.parametrize("tokens", [4096, 8192])
def test_documents_no_shorter_than_the_sequence_change_nothing(tokens):
    one, packed = _scenario(DENSE), _scenario({**DENSE, "document_tokens": tokens})
    for engine in ("analytic", "graph"):
        a, b = evaluate(one, engine), evaluate(packed, engine)
        assert (b.step_time_s, b.peak_memory_bytes) == (a.step_time_s, a.peak_memory_bytes)


def test_each_of_two_cp_ranks_computes_half_of_the_documents_attention():
    # four documents of 1024 tokens, h = 1024: 4 x 1024²/2 causal pairs, 4·h FLOPs each forward
    # (QK^T and AV, 2 FLOPs per multiply-add) = 2^33 on one rank, half of it on each of two
    model = _scenario({**DENSE, "document_tokens": 1024}).model
    assert attention_fwd_flops(model, 1) == 4 * 1024**2 / 2 * 4 * 1024 == 2**33
    assert attention_fwd_flops(model, 2) == 2**32


@pytest.mark.parametrize("method", ["ring", "kv-allgather", "ulysses"])
def test_transformer_engine_context_parallelism_runs_over_packed_documents(method):
    long = {**DENSE, "seq_len": 32768}
    packed = _scenario({**long, "document_tokens": 4096}, cp=2, dp=4, cp_attention=method)
    one = _scenario(long, cp=2, dp=4, cp_attention=method)
    for engine in ("analytic", "graph"):
        assert evaluate(packed, engine).step_time_s < evaluate(one, engine).step_time_s


@pytest.mark.parametrize("model,plan,field", [
    ({**DENSE, "document_tokens": 1024}, {"cp": 2, "dp": 4, "cp_attention": "torch-allgather"}, "plan.cp_attention"),
    ({**DENSE, "document_tokens": 1022}, {"cp": 2, "dp": 4}, "model.document_tokens"),
])
def test_what_context_parallelism_over_documents_cannot_represent_is_refused(model, plan, field):
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        _scenario(model, **plan)


def test_a_negative_document_length_is_refused():
    with pytest.raises(InputError, match=r"model\.document_tokens"):
        _scenario({**DENSE, "document_tokens": -1})


def test_packed_documents_lie_outside_runs_that_attended_whole_sequences():
    flags = outside(_scenario({**DENSE, "document_tokens": 1024}), {"model.attention_mask": ["causal"]})
    assert flags == [{"field": "model.attention_mask", "value": "documents", "checked": ["causal"]}]
    assert outside(_scenario(DENSE), {"model.attention_mask": ["causal"]}) == []
