"""The input pipeline: the data-bound crossover worked by hand, and the step it stalls."""

import math

import pytest

from simulator import evaluate, load_scenario
from simulator.datapipe import data_time
from simulator.hardware import Cluster, load_accelerator, load_network, load_node
from simulator.training import DataPipeline, Dataset, Storage

# one image per object-store request (the layout the PyTorch DataLoader study found 95 % idle)
IMAGES = Dataset("images", storage_bytes_per_token=76.7, tokens_per_request=640, cpu_tokens_per_s_per_core=3.33e4,
                 host_to_device_bytes_per_token=1058)
OBJECTS = Storage("object-store", 12.5e9, 12.5e9, request_latency_s=0.15)


def one_dgx_h100():
    node = load_node("dgx-h100")
    return Cluster(load_accelerator(node.accelerator), node, load_network(node.network), 1, 8)


def test_data_bound_crossover_of_per_image_object_store_requests():
    # 16 workers (2 per device) each fetch (0.15 s per 640 tokens) then decode (1/33,300 s per
    # token): a worker spends 2.34375e-4 + 3.003e-5 = 2.64405e-4 s per token, so 16 workers
    # keep up with a 1 s step up to 16 / 2.64405e-4 = 60,513 tokens per node
    cluster, pipe = one_dgx_h100(), DataPipeline(workers_per_device=2, prefetch=2)
    crossover = 16 / (0.15 / 640 + 1 / 3.33e4)
    assert crossover == pytest.approx(60_513, rel=1e-4)
    below = data_time(0.99 * crossover, 8192, 1.0, pipe, IMAGES, OBJECTS, cluster)
    above = data_time(1.01 * crossover, 8192, 1.0, pipe, IMAGES, OBJECTS, cluster)
    assert below.workers_s == pytest.approx(0.99) and below.exposed_s == 0.0
    assert above.workers_s == pytest.approx(1.01) and above.exposed_s == pytest.approx(0.01)


def test_without_workers_loading_adds_to_the_step():
    cluster = one_dgx_h100()
    sync = data_time(30_000, 8192, 1.0, DataPipeline(workers_per_device=0), IMAGES, OBJECTS, cluster)
    # the 8 training processes load themselves: 30,000 x 2.64405e-4 / 8 s, all of it exposed
    assert sync.exposed_s == pytest.approx(30_000 * (0.15 / 640 + 1 / 3.33e4) / 8)


def test_storage_bandwidth_and_host_copy_are_pipeline_stages():
    cluster = one_dgx_h100()
    fat = Dataset("raw", storage_bytes_per_token=1e5, tokens_per_request=1e9, cpu_tokens_per_s_per_core=1e12,
                  host_to_device_bytes_per_token=1e4)
    t = data_time(1e5, 8192, 1.0, DataPipeline(), fat, OBJECTS, cluster)
    assert t.storage_s == pytest.approx(1e5 * 1e5 / 12.5e9)  # 10 GB at 12.5 GB/s per node
    # per device over the PCIe Gen5 link, which two GPUs share on a DGX H100 (PCIe switch uplink)
    assert t.copy_s == pytest.approx(1e5 / 8 * 1e4 / (64e9 / 2))
    assert t.data_s == max(t.storage_s, t.workers_s, t.copy_s)


def test_pretokenised_text_does_not_stall_a_large_model():
    d = evaluate(load_scenario("scenarios/quickstart.yaml"), "analytic").to_dict()
    assert d["data_bound"] is False and d["breakdown_s"]["data"] == 0.0 and d["data_time_s"] > 0


def test_a_data_bound_step_is_the_data_time():
    over = {"training.data.dataset": {"storage_bytes_per_token": 76.7, "tokens_per_request": 640,
                                      "cpu_tokens_per_s_per_core": 3.33e4, "host_to_device_bytes_per_token": 1058},
            "training.data.storage": "object-store"}
    d = evaluate(load_scenario("scenarios/quickstart.yaml", over), "analytic").to_dict()
    assert d["data_bound"] is True
    assert d["step_time_s"] == pytest.approx(d["data_time_s"], rel=1e-12)
    assert d["data_idle_fraction"] == pytest.approx(d["breakdown_s"]["data"] / d["step_time_s"])
    assert math.isclose(sum(d["breakdown_s"].values()), d["step_time_s"], rel_tol=1e-12)
