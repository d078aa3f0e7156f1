"""Loader-worker throughput of one CPU core: the `cpu_tokens_per_s_per_core` of the data
presets (simulator/data/datasets/). Run: python benchmarks/bench_data_rates.py

- text-pretokenized: what a Megatron-LM GPTDataset worker does per sample
  (NVIDIA/Megatron-LM@e668a4f megatron/core/datasets/gpt_dataset.py): slice seq_len+1 int32
  token ids out of a memory-mapped .bin file (page cache warm: the storage read is modelled
  apart) and copy them to int64; the collate stacks the samples.
- image-text: a LLaVA-style image sample: decode a 500x375 WEBP image (the encoding of the
  timm/imagenet-w21-webp-wds shards the preset's sizes come from), resize to 336x336,
  normalise to float32 CHW (what a CLIP ViT-L/14-336 preprocessor does).
One process, one thread; timings on a shared machine are noisy (best of 5).
"""

from __future__ import annotations

import io
import os
import tempfile
import time

import numpy as np


def best_rate(fn, units: float, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return units / best


def text_tokens_per_s(seq_len: int = 8192, samples: int = 256) -> float:
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tokens.bin")
        rng.integers(0, 128256, size=32 * 2**20, dtype=np.int32).tofile(path)
        data = np.memmap(path, dtype=np.int32, mode="r")
        starts = rng.integers(0, data.size - seq_len - 1, size=samples)
        np.asarray(data).sum()  # warm the page cache

        def run():
            batch = [np.array(data[s:s + seq_len + 1], dtype=np.int64) for s in starts]
            np.stack(batch)

        return best_rate(run, samples * seq_len)


def image_samples_per_s(images: int = 64) -> float:
    from PIL import Image

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:375, 0:500]
    pixels = np.stack([(x * 0.5 + y * 0.2) % 256, (y * 0.7) % 256, (x * 0.3) % 256], -1)
    pixels = (pixels + rng.normal(0, 12, pixels.shape)).clip(0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="WEBP", quality=90)
    blob = buf.getvalue()
    mean = np.array([0.481, 0.458, 0.408], dtype=np.float32)
    std = np.array([0.269, 0.261, 0.276], dtype=np.float32)

    def run():
        for _ in range(images):
            img = Image.open(io.BytesIO(blob)).convert("RGB").resize((336, 336), Image.BICUBIC)
            arr = (np.asarray(img, dtype=np.float32) / 255.0 - mean) / std
            np.ascontiguousarray(arr.transpose(2, 0, 1))

    return best_rate(run, images), len(blob)


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"text-pretokenized: {text_tokens_per_s():.3e} tokens/s per core")
    rate, jpeg = image_samples_per_s()
    print(f"image-text: {rate:.1f} images/s per core (WEBP {jpeg / 1e3:.0f} kB, 500x375 -> 336x336)")


if __name__ == "__main__":
    main()
