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
