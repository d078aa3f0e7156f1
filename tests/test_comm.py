"""Collective times: nccl-tests bus-bandwidth convention, placement of groups on nodes."""

import pytest

from simulator.comm import Placement, collective_time, placement


def test_tp_group_of_8_sits_in_one_node():
    p = placement({"tp": 8, "cp": 1, "dp": 4, "pp": 2}, "tp", "tp-cp-dp-pp", 8)
    assert (p.local, p.domains) == (8, 1)


def test_dp_group_outside_tp8_has_one_rank_per_node():
    p = placement({"tp": 8, "cp": 1, "dp": 4, "pp": 2}, "dp", "tp-cp-dp-pp", 8)
    assert (p.local, p.domains) == (1, 4)


def test_dp_group_with_tp2_has_four_ranks_per_node():
    p = placement({"tp": 2, "cp": 1, "dp": 16, "pp": 1}, "dp", "tp-cp-dp-pp", 8)
    assert (p.local, p.domains) == (4, 4)


def test_ring_all_reduce_inside_a_node_follows_2_n_minus_1_over_n(dgx_a100):
    cluster = dgx_a100(1)
    link = cluster.node.scaleup
    size, n = 1.0e9, 8
    expected = 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * size / (link.bytes_per_s * link.efficiency)
    got = collective_time("all_reduce", size, Placement(n, n, 1), cluster)
    assert float(got) == pytest.approx(expected)


def test_all_gather_moves_half_the_all_reduce_volume(dgx_a100):
    cluster = dgx_a100(1)
    group = Placement(8, 8, 1)
    ag = collective_time("all_gather", 4.0e9, group, cluster)
    ar = collective_time("all_reduce", 4.0e9, group, cluster)
    assert float(ar) == pytest.approx(2 * float(ag), rel=1e-3)


def test_cross_node_all_reduce_uses_each_devices_nic_share(dgx_a100):
    cluster = dgx_a100(4)
    out = cluster.scaleout
    size, k = 2.0e9, 4
    # one rank per node: ring over the network at 200 Gb/s x efficiency per device
    expected = 2 * (k - 1) * out.latency_s + 2 * (k - 1) / k * size / (25e9 * out.efficiency)
    got = collective_time("all_reduce", size, Placement(4, 1, 4), cluster)
    assert float(got) == pytest.approx(expected, rel=1e-9)


def test_single_rank_group_takes_no_time(dgx_a100):
    assert float(collective_time("all_reduce", 1.0e9, Placement(1, 1, 1), dgx_a100(1))) == 0.0


def test_a_cluster_with_fewer_nics_gives_each_device_a_smaller_share_of_the_network():
    from simulator.hardware import cluster_from_dict

    # four 200 Gb/s NICs shared by eight GPUs: 4 x 25 GB/s / 8 = 12.5 GB/s each (the profile: 8 x 25 / 8)
    fewer = cluster_from_dict({"node": "dgx-a100", "nodes": 2, "nics": 4})
    slower = cluster_from_dict({"node": "dgx-a100", "nodes": 2, "nic_gbit_per_s": 100})
    assert fewer.scaleout.bytes_per_s == slower.scaleout.bytes_per_s == pytest.approx(12.5e9)
    assert cluster_from_dict({"node": "dgx-a100", "nodes": 2}).scaleout.bytes_per_s == pytest.approx(25e9)


def _mi300x(nodes=1):
    from simulator.hardware import cluster_from_dict

    return cluster_from_dict({"node": "mi300x-node", "nodes": nodes})


def test_a_pair_on_a_full_mesh_drives_one_of_its_seven_links():
    # 448 GB/s over 7 peers: 64 GB/s per pair, x 0.7 efficiency; ring all-reduce of 2: 2 steps, S/2 each way
    cluster, size = _mi300x(), 1.0e9
    link = cluster.node.scaleup
    expected = 2 * link.latency_s + 2 * (1 / 2) * size / (64e9 * 0.7)
    assert float(collective_time("all_reduce", size, Placement(2, 2, 1), cluster)) == pytest.approx(expected)


def test_the_whole_mesh_drives_every_link():
    cluster, size, n = _mi300x(), 1.0e9, 8
    link = cluster.node.scaleup
    expected = 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * size / (448e9 * 0.7)
    assert float(collective_time("all_reduce", size, Placement(n, n, 1), cluster)) == pytest.approx(expected)


def test_mi300x_all_reduce_bandwidth_of_2_over_8_gpus_is_the_measured_ratio():
    """RCCL all-reduce bus bandwidth at 4 GiB on one 8 x MI300X node: 47.671 GB/s on 2 GPUs,
    312.912 GB/s on 8 (stas00/ml-engineering@744d01e network/README.md)."""
    cluster, size = _mi300x(), 4 * 2**30

    def busbw(n):
        return 2 * (n - 1) / n * size / float(collective_time("all_reduce", size, Placement(n, n, 1), cluster))

    assert busbw(2) / busbw(8) == pytest.approx(47.671 / 312.912, rel=0.08)


def test_a_switch_gives_a_pair_the_whole_link(dgx_a100):
    cluster, size = dgx_a100(1), 1.0e9
    link = cluster.node.scaleup
    expected = 2 * link.latency_s + size / (link.bytes_per_s * link.efficiency)
    assert float(collective_time("all_reduce", size, Placement(2, 2, 1), cluster)) == pytest.approx(expected)


def test_a_pipeline_send_on_a_full_mesh_takes_one_peer_link():
    from simulator.comm import send_recv_time

    cluster, size = _mi300x(), 1.0e9
    expected = cluster.node.scaleup.latency_s + size / (64e9 * 0.7)
    assert float(send_recv_time(size, False, cluster)) == pytest.approx(expected)


def test_an_nvl72_group_spanning_trays_stays_on_nvlink():
    from simulator.hardware import cluster_from_dict

    # 4 GPUs per tray, 72 per NVLink domain: TP 8 over two trays all-gathers over NVLink5 (900 GB/s x 0.756)
    cluster, size, n = cluster_from_dict({"node": "gb200-nvl72", "nodes": 36}), 1.0e9, 8
    group = placement({"tp": 8, "cp": 1, "dp": 18, "pp": 1}, "tp", "tp-cp-dp-pp", cluster.scaleup_domain)
    assert (group.local, group.domains) == (8, 1)
    link = cluster.node.scaleup
    expected = (n - 1) * link.latency_s + (n - 1) / n * size / (900e9 * 0.756)
    assert float(collective_time("all_gather", size, group, cluster)) == pytest.approx(expected)


def test_a_group_wider_than_one_nvl72_rack_crosses_the_network():
    from simulator.hardware import cluster_from_dict

    cluster = cluster_from_dict({"node": "gb200-nvl72", "nodes": 36})  # 144 GPUs, two racks
    group = placement({"tp": 8, "cp": 1, "dp": 18, "pp": 1}, "dp", "tp-cp-dp-pp", cluster.scaleup_domain)
    assert (group.local, group.domains) == (9, 2)  # 72 / 8 = 9 DP ranks per rack


def _busbw(cluster, n, size=8 * 2**30):
    return 2 * (n - 1) / n * size / float(collective_time("all_reduce", size, Placement(n, n, 1), cluster))


# nccl-tests all-reduce bus bandwidth at 8 GiB on one node, NCCL's own choice of algorithm:
# Ring up to 4 (H200) or 5 (B200) GPUs, NVLS above (stas00/ml-engineering@744d01e
# network/README.md, NVLS section). The profiles take NVLS's efficiency from 8 GPUs only.
H200_BUSBW = {4: 363.3, 5: 414.2, 6: 435.6, 7: 460.0, 8: 473.1}
B200_BUSBW = {4: 673.2, 5: 677.8, 6: 778.2, 7: 811.2, 8: 838.0}


@pytest.mark.parametrize("node, measured", [("dgx-h200", H200_BUSBW), ("dgx-b200", B200_BUSBW)])
def test_all_reduce_inside_an_nvswitch_node_follows_the_measured_ring_to_nvls_ramp(node, measured):
    from simulator.hardware import cluster_from_dict

    cluster = cluster_from_dict({"node": node, "nodes": 1})
    for n, gbps in measured.items():
        assert _busbw(cluster, n) / 1e9 == pytest.approx(gbps, rel=0.05), n


def test_nvls_is_used_only_from_its_group_size_on():
    from simulator.hardware import cluster_from_dict

    cluster = cluster_from_dict({"node": "dgx-h200", "nodes": 1})
    ring = cluster.node.scaleup.bus_bytes_per_s
    assert _busbw(cluster, 4) < ring < _busbw(cluster, 5)


def test_a100_nvswitch_has_no_in_switch_reduction(dgx_a100):
    cluster, n = dgx_a100(1), 8
    assert cluster.node.scaleup.nvls is None
    assert _busbw(cluster, n) < cluster.node.scaleup.bus_bytes_per_s


def test_all_reduce_across_nodes_does_not_use_nvls():
    from simulator.hardware import cluster_from_dict

    cluster, size = cluster_from_dict({"node": "dgx-h200", "nodes": 2}), 1.0e9
    up, out = cluster.node.scaleup, cluster.scaleout
    # ring reduce-scatter and all-gather inside each node, a 2-rank ring across them
    inside = 7 * up.latency_s + 7 / 8 * size / up.bus_bytes_per_s
    across = 2 * out.latency_s + size / 8 / out.bus_bytes_per_s
    got = collective_time("all_reduce", size, Placement(16, 8, 2), cluster)
    assert float(got) == pytest.approx(2 * inside + across)


def test_in_switch_reduction_on_a_switchless_mesh_is_refused():
    import yaml
    from importlib import resources

    from simulator import InputError
    from simulator.hardware import node_from_dict

    data = yaml.safe_load(resources.files("simulator").joinpath(
        "data/hardware_profiles/nodes/mi300x-node.yaml").read_text())
    data["scaleup"]["nvls"] = {"min_devices": 5, "efficiency": 0.6, "latency_us": 25}
    with pytest.raises(InputError, match="scaleup.nvls.*only behind a switch"):
        node_from_dict(data, "node")
