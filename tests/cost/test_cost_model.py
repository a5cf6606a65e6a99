import pytest

import alpaviz as av


@pytest.fixture
def cluster():
    return av.Cluster(
        num_hosts=2,
        devices_per_host=4,
        device=av.DeviceSpec("toy", peak_flops=100e12, memory_bytes=16e9, memory_bandwidth=1e12),
        intra_host=av.Link(alpha_s=1e-6, bandwidth_bytes_per_s=100e9),
        inter_host=av.Link(alpha_s=1e-5, bandwidth_bytes_per_s=10e9),
    )


def test_collectives_match_alpha_beta_by_hand(cluster):
    cm = av.CostModel()
    mesh = cluster.logical_mesh((2, 4), (2, 4))
    nbytes = 8e6
    # Axis 1 stays in a host (4 devices, 100 GB/s); axis 0 crosses hosts (2 devices, 10 GB/s).
    assert cm.all_reduce(nbytes, mesh, 1) == pytest.approx(1e-6 + 2 * 3 / 4 * 8e6 / 100e9)
    assert cm.all_gather(nbytes, mesh, 1) == pytest.approx(1e-6 + 3 / 4 * 8e6 / 100e9)
    # Over axis 0 the 4 groups (one per column) run at once and share each host's 10 GB/s link.
    assert cm.reduce_scatter(nbytes, mesh, 0) == pytest.approx(1e-5 + 1 / 2 * 8e6 / (10e9 / 4))
    assert cm.all_to_all(nbytes, mesh, 1) == pytest.approx(1e-6 + 3 / 16 * 8e6 / 100e9)
    # Both axes: 8 devices bound by the slower inter-host link.
    assert cm.all_reduce(nbytes, mesh, (0, 1)) == pytest.approx(1e-5 + 2 * 7 / 8 * 8e6 / 10e9)
    assert cm.send_recv(nbytes, cluster.inter_host) == pytest.approx(1e-5 + 8e6 / 10e9)


def test_a_hosts_network_link_is_shared_by_the_groups_that_use_it_at_once(cluster):
    cm = av.CostModel()
    nbytes = 8e6
    one_group = cluster.logical_mesh((2, 4), (8, 1))
    four_groups = cluster.logical_mesh((2, 4), (2, 4))
    assert cm.all_reduce(nbytes, one_group, 0) == pytest.approx(1e-5 + 2 * 7 / 8 * nbytes / 10e9)
    assert cm.all_reduce(nbytes, four_groups, 0) == pytest.approx(1e-5 + 2 * 1 / 2 * nbytes / (10e9 / 4))
    # Inside one host nothing crosses the network, so nothing is shared.
    in_host = cluster.logical_mesh((1, 4), (2, 2))
    assert cm.all_reduce(nbytes, in_host, 0) == pytest.approx(1e-6 + 2 * 1 / 2 * nbytes / 100e9)


def test_collective_on_one_device_is_free(cluster):
    cm = av.CostModel()
    mesh = cluster.logical_mesh((1, 4), (4, 1))
    assert cm.all_reduce(1e9, mesh, 1) == 0.0
    assert cm.all_gather(0, mesh, 0) == 0.0


def test_compute_time_is_roofline(cluster):
    cm = av.CostModel(compute_efficiency=0.5, memory_efficiency=1.0)
    dev = cluster.device
    assert cm.compute_time(1e12, 1e3, dev) == pytest.approx(1e12 / 50e12)
    assert cm.compute_time(1e3, 1e9, dev) == pytest.approx(1e9 / 1e12)
    with pytest.raises(ValueError, match="compute_efficiency"):
        av.CostModel(compute_efficiency=0)


def test_submeshes_and_logical_shapes_follow_alpa(cluster):
    assert cluster.submesh_shapes() == ((1, 1), (1, 2), (1, 4), (2, 4))
    assert cluster.logical_shapes((2, 4)) == ((8, 1), (4, 2), (2, 4))
    mesh = cluster.logical_mesh((1, 2), (1, 2), first_device=4)
    assert mesh.device_ids == (4, 5)
    assert mesh.axis_links == (cluster.intra_host, cluster.intra_host)
    cross = cluster.logical_mesh((2, 4), (4, 2))
    assert cross.axis_links[0] == cluster.inter_host and cross.axis_links[1] == cluster.intra_host


def test_bad_cluster_inputs_are_explained(cluster):
    with pytest.raises(ValueError, match="must use all 4 devices"):
        cluster.validate_submesh((2, 2))
    with pytest.raises(ValueError, match="not a view of submesh"):
        cluster.logical_mesh((1, 4), (2, 4))
    with pytest.raises(ValueError, match="runs past"):
        cluster.logical_mesh((1, 4), first_device=6)
    with pytest.raises(ValueError, match="bandwidth"):
        av.Link(alpha_s=0, bandwidth_bytes_per_s=0)


def test_presets():
    assert av.Cluster.a100_node(2).num_devices == 16
    assert av.Cluster.h100_node().device.memory_bytes == 80e9
    local = av.Cluster.local()
    assert local.num_devices == 8


def test_fusible_operators_are_charged_a_share_of_their_traffic(cluster):
    cm = av.CostModel(compute_efficiency=1.0, memory_efficiency=1.0, fused_traffic_share=0.1)
    dev = cluster.device
    # A matmul pays its full traffic; an elementwise add only the fused share of it.
    assert cm.op_time("dot_general", 0.0, 1e9, dev) == pytest.approx(1e9 / 1e12)
    assert cm.op_time("add", 0.0, 1e9, dev) == pytest.approx(0.1 * 1e9 / 1e12)
    assert cm.op_time("add", 1e12, 1e9, dev) == pytest.approx(1e12 / 100e12)
    with pytest.raises(ValueError, match="fused_traffic_share"):
        av.CostModel(fused_traffic_share=2.0)


def test_peak_flops_depend_on_the_operands_dtype():
    """An fp32 matmul on an A100 runs at the TF32 peak, half the fp16 one; without an fp32 figure one peak serves."""
    a100 = av.Cluster.a100_node(1).device
    cm = av.CostModel(compute_efficiency=1.0)
    assert cm.compute_time(312e12, 0.0, a100, "float16") == pytest.approx(1.0)
    assert cm.compute_time(312e12, 0.0, a100, "bfloat16") == pytest.approx(1.0)
    assert cm.compute_time(312e12, 0.0, a100, "float32") == pytest.approx(2.0)
    assert cm.op_time("dot_general", 312e12, 0.0, a100, "float32") == pytest.approx(2.0)
    plain = av.DeviceSpec("plain", peak_flops=1e12, memory_bytes=1e9)
    assert cm.compute_time(1e12, 0.0, plain, "float32") == cm.compute_time(1e12, 0.0, plain, "float16") == 1.0
    for preset in (av.Cluster.a100_node, av.Cluster.v100_node, av.Cluster.h100_node):
        device = preset(1).device
        assert device.fp32_peak_flops is not None and device.fp32_peak_flops < device.peak_flops
    with pytest.raises(ValueError, match="fp32_peak_flops"):
        av.DeviceSpec("bad", peak_flops=1e12, memory_bytes=1e9, fp32_peak_flops=-1.0)


def test_the_ilp_prices_an_fp32_step_at_the_fp32_peak():
    import jax
    import jax.numpy as jnp

    from alpaviz.core.intra_op import solve_sharding

    cluster = av.Cluster.a100_node(1)
    mesh = cluster.logical_mesh((1, 1), (1, 1))
    costs = {}
    for dtype in (jnp.float32, jnp.float16):
        x, w = jax.ShapeDtypeStruct((4096, 4096), dtype), jax.ShapeDtypeStruct((4096, 4096), dtype)
        graph = av.trace(lambda x, w: x @ w, x, w)
        costs[dtype] = solve_sharding(graph, mesh, cluster, av.CostModel()).cost.compute_s
    assert costs[jnp.float32] == pytest.approx(2 * costs[jnp.float16], rel=1e-6)


def test_small_operators_run_below_the_peak_by_the_rate_curve():
    device = av.DeviceSpec("cpu", peak_flops=1e10, memory_bytes=1e9, memory_bandwidth=1e15,
                           rate_curve=((1e6, 0.25), (1e8, 1.0)))
    cm = av.CostModel(compute_efficiency=1.0, memory_efficiency=1.0)
    assert cm.compute_time(1e6, 0, device) == pytest.approx(1e6 / (1e10 * 0.25))
    assert cm.compute_time(1e7, 0, device) == pytest.approx(1e7 / (1e10 * 0.625))  # halfway in log FLOPs
    assert cm.compute_time(1e9, 0, device) == pytest.approx(1e9 / 1e10)  # flat past the largest size
    assert cm.compute_time(1e3, 0, device) == pytest.approx(1e3 / (1e10 * 0.25))  # and below the smallest
    plain = av.DeviceSpec("cpu", peak_flops=1e10, memory_bytes=1e9, memory_bandwidth=1e15)
    assert cm.compute_time(1e6, 0, plain) == pytest.approx(1e6 / 1e10)
    with pytest.raises(ValueError, match="rate_curve must list increasing FLOPs"):
        av.DeviceSpec("cpu", 1e10, 1e9, rate_curve=((1e8, 1.0), (1e6, 0.5)))
