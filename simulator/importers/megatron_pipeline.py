"""How Megatron-Core splits the layers over pipeline stages, as a Megatron-LM launch script or a
NeMo YAML says it (TransformerConfig field names; megatron.py's megatron_key / nemo_key spell
them), into plan.first_stage_layers / last_stage_layers or plan.pipeline_layout.

- num_layers_in_first/last_pipeline_stage (--decoder-first/last-pipeline-num-layers): the
  first and last ranks' layers, the rest split evenly (stagesplit.py, the same rule);
- account_for_embedding/loss_in_pipeline_split: the embedding and the loss each weigh one
  layer, the (layers + 1 or 2) split evenly over the pp x vpp virtual stages, the first
  (last) virtual stage holding one layer less (megatron/core/transformer/transformer_block.py
  get_num_layers_to_build @d98e8a64dd);
- pipeline_model_parallel_layout: one string, virtual stages in model order separated by `|`,
  `E` the embedding, `t` a decoder layer, `m` an MTP module, `L` the loss, with `(...)*n` and
  `x*n` repetition and cosmetic commas (pipeline_parallel_layer_layout.py parse_str_to_list);
  the virtual stages per rank are its stage count / pp.
"""

from __future__ import annotations

import re
from typing import Callable

from .common import Account

MAX_LAYOUT = 100_000  # characters of an unrolled layout: far beyond any real model


def read_stage_split(a: Account, key: Callable[[str], str], layers: int, pp: int, vpp: int, number) -> int:
    """Map the stage split of `a` into a.scenario; returns the virtual stages per rank (a
    layout sets them)."""
    for size, name in ((pp, "pipeline_model_parallel_size"), (vpp, "virtual_pipeline_model_parallel_size")):
        if not isinstance(size, int) or size < 1:  # the split divides by them
            a.refuse(key(name), "expected an integer >= 1")
    first, last = key("num_layers_in_first_pipeline_stage"), key("num_layers_in_last_pipeline_stage")
    layout_key = key("pipeline_model_parallel_layout")
    embedding = bool(a.get(key("account_for_embedding_in_pipeline_split")))
    loss = bool(a.get(key("account_for_loss_in_pipeline_split")))
    a.used(key("account_for_embedding_in_pipeline_split"), key("account_for_loss_in_pipeline_split"))
    if a.has(layout_key):
        stages = _layout(a, layout_key, layers, pp)
        a.map(layout_key, "plan.pipeline_layout", stages)
        return len(stages) // pp
    if a.has(first) or a.has(last):
        if embedding or loss:
            a.refuse(first if a.has(first) else last, "Megatron-Core does not take first/last-stage layer counts "
                                                       "together with account_for_embedding/loss_in_pipeline_split")
        for k, field in ((first, "first_stage_layers"), (last, "last_stage_layers")):
            if a.has(k):
                a.map(k, f"plan.{field}", number(a, k))
    elif embedding or loss:
        stages = pp * vpp
        weighed = layers + embedding + loss
        if weighed % stages:
            a.refuse(key("account_for_embedding_in_pipeline_split" if embedding else
                         "account_for_loss_in_pipeline_split"),
                     f"{layers} layers + the embedding/loss ({weighed}) must divide over the {stages} virtual stages")
        split = [weighed // stages] * stages
        split[0] -= embedding
        split[-1] -= loss
        a.map(key("account_for_embedding_in_pipeline_split" if embedding else "account_for_loss_in_pipeline_split"),
              "plan.pipeline_layout", split)
    return vpp


def _layout(a: Account, k: str, layers: int, pp: int) -> list:
    """Decoder layers per virtual stage of a layout string; refused unless the embedding opens
    the first stage, the loss closes the last, MTP modules sit in the last stage and the
    decoder layers number `layers`."""
    text = str(a.get(k)).replace(",", "").replace(" ", "")
    for pattern in (r"\(([^()]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda m: _repeat(a, k, m.group(1), int(m.group(2)), len(text)), text)
    stages = text.split("|")
    if set(text) - set("ELtm|") or len(stages) % pp:
        a.refuse(k, f"expected virtual stages of E, t, m and L separated by |, a multiple of pp={pp} of them")
    if text.count("E") != 1 or not stages[0].startswith("E") or text.count("L") != 1 or \
            not stages[-1].endswith("L") or any("m" in s for s in stages[:-1]):
        a.refuse(k, "llmsim places the embedding first in the first stage and the MTP modules and loss in the last")
    counts = [s.count("t") for s in stages]
    if sum(counts) != layers:
        a.refuse(k, f"{sum(counts)} decoder layers (t) where the model has {layers}")
    return counts


def _repeat(a: Account, k: str, unit: str, times: int, length: int) -> str:
    if len(unit) * times + length > MAX_LAYOUT:
        a.refuse(k, f"longer than {MAX_LAYOUT} characters once its repetitions are unrolled")
    return unit * times
