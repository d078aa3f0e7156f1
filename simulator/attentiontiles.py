"""Which (query, key) pairs a tiled flash-attention kernel computes under a causal mask.

A flash kernel runs each block of query rows over blocks of keys. Under a causal mask it
skips the key blocks wholly after the query block's last row, but computes every block it
visits in full and masks the excess. How much it computes beyond the causal half s²/2 is a
property of the kernel's block sizes, not of the model, so a profile states them
(`efficiency.attention_tiles`, hardware.Accelerator.attention_tiles); a profile without them
counts the causal half exactly (compute.op_times), as a GPU kernel over 128 x 128 tiles nearly
does (over 4,096 tokens it computes 3 % more).

PyTorch's CPU flash kernel (SDPA's CPU default and its FLASH_ATTENTION backend) is the case
that matters: key blocks of 512 and query blocks of 32, 64 or 256 rows by the query length
(pytorch/pytorch@430c4e3b39 aten/src/ATen/native/cpu/FlashAttentionKernel.cpp:
flash_attention_kernel_impl picks cpu_flash_attention<..., 256, 512> for q_seq_len >= 768, 64
for >= 192, else 32; a query block at row m visits keys n < min(m + rows, kv) in whole blocks
of min(512, kv - n); the backward, cpu_flash_attention_backward, loops alike). Over 512 tokens
or fewer every query block computes all keys: causal attention costs what full attention
does. Measured with torch 2.13.0 on one Xeon core (docs/calibration.md, Results 2026-12-05):
causal over full time 1.05 at 512 tokens, 0.77 at 1,024, 0.64 at 2,048 (these blocks: 1.0,
0.75, 0.625).

The blocks change the kernel's time, not the FLOPs a result counts: its hardware FLOPs (HFU)
stay the causal half, as the model FLOPs (MFU) do.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class Tiles:
    """A flash kernel's block sizes: `kv` keys per block; query rows per block by the call's
    query length, `q` = ((from_tokens, rows), ...) in rising order of from_tokens."""

    kv: int
    q: tuple

    def rows(self, tokens: int) -> int:
        """Query rows per block for a call over `tokens` queries (at most the call's own)."""
        return min(tokens, next(rows for start, rows in reversed(self.q) if tokens >= start))


# pytorch/pytorch@430c4e3b39 aten/src/ATen/native/cpu/FlashAttentionKernel.cpp (above)
PYTORCH_CPU_FLASH = Tiles(kv=512, q=((0, 32), (192, 64), (768, 256)))


@lru_cache(maxsize=256)
def tiled_pairs(tokens: int, tiles: Tiles) -> float:
    """(query, key) pairs the kernel computes for causal attention over `tokens` tokens: each
    query block of r rows from row m over min(m + r, tokens) keys rounded up to whole key
    blocks (the last block of the sequence may be shorter)."""
    if tokens <= 0:
        return 0.0
    rows, kv = tiles.rows(tokens), min(tiles.kv, tokens)
    starts = np.arange(0, tokens, rows)
    block_rows = np.minimum(rows, tokens - starts)
    visited = np.minimum(starts + block_rows, tokens)
    keys = np.minimum(-(-visited // kv) * kv, tokens)
    return float(np.sum(block_rows * keys))


def executed_fraction(lengths: tuple, tiles: Tiles) -> float:
    """The pairs the kernel computes over the causal pairs, for calls over documents
    `lengths` = ((tokens, count), ...)."""
    causal = sum(count * 0.5 * tokens * tokens for tokens, count in lengths)
    return sum(count * tiled_pairs(tokens, tiles) for tokens, count in lengths) / causal
