"""Calibration measures the local devices once per machine and a calibrated cluster carries the figures."""

import json
import math

import pytest

import alpaviz as av
from alpaviz.core.cost import calibrate


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One calibration, cached, for the tests that read its figures (each measuring takes seconds)."""
    path = tmp_path_factory.mktemp("calibration")
    calibrate(cache_dir=path)
    return path


def test_calibration_measures_plausible_figures_and_caches_them(tmp_path):
    first = calibrate(cache_dir=tmp_path)
    assert first.num_devices == 8 and first.device_kind == "cpu"
    for figure in (first.matmul_flops, first.memory_bandwidth, first.collective_bandwidth):
        assert math.isfinite(figure) and figure > 1e6
    assert 0 < first.collective_alpha_s < 1.0
    cached = calibrate(cache_dir=tmp_path)
    assert cached == first  # read back, not measured again (the measuring time is the same too)
    assert calibrate(cache_dir=tmp_path, refresh=True).seconds != first.seconds


def test_a_damaged_cache_is_measured_again(tmp_path):
    calibrate(cache_dir=tmp_path)
    (cache,) = tmp_path.glob("calibration-*.json")
    cache.write_text(json.dumps({"matmul_flops": "fast"}))
    assert calibrate(cache_dir=tmp_path).matmul_flops > 0


def test_a_calibrated_local_cluster_carries_the_measurement(shared_cache):
    measured = calibrate(cache_dir=shared_cache)
    cluster = av.Cluster.local(calibrate=True, cache_dir=shared_cache)
    assert cluster.device.peak_flops == measured.matmul_flops
    assert cluster.device.memory_bandwidth == measured.memory_bandwidth
    assert cluster.intra_host.bandwidth_bytes_per_s == measured.collective_bandwidth
    assert cluster.name.endswith("(calibrated)")
    assert av.Cluster.local().device.peak_flops == 5e10  # nominal figures unless asked


def test_calibration_measures_how_the_devices_share_the_host(shared_cache):
    measured = calibrate(cache_dir=shared_cache)
    curve = measured.busy_speedup
    assert len(curve) == 8 and curve[-1] == 1.0
    # 8 virtual devices on this 2-core machine: one busy device runs several times faster than
    # each of 8 busy ones, and fewer busy devices never run slower than more
    assert curve[0] > 2.0
    assert all(a >= b * 0.8 for a, b in zip(curve, curve[1:]))
    assert 0 < measured.launch_s < 0.05
    cluster = av.Cluster.local(calibrate=True, cache_dir=shared_cache)
    assert cluster.busy_speedup == curve and cluster.device.launch_s == measured.launch_s
    assert cluster.speedup(1) == curve[0] and cluster.speedup(8) == 1.0
    text = measured.describe()
    assert "launch" in text and f"1: {curve[0]:.2f}x" in text
    assert av.Cluster.local().speedup(1) == 1.0  # nominal clusters share nothing


def test_calibration_measures_the_speedup_at_every_matmul_size(shared_cache):
    measured = calibrate(cache_dir=shared_cache)
    sizes = [f for f, _ in measured.busy_speedup_by_size]
    assert sizes == [f for f, _ in measured.rate_curve]  # the rate curve's sizes
    for _, row in measured.busy_speedup_by_size:
        assert len(row) == 8 and row[-1] == 1.0
        assert all(a >= b for a, b in zip(row, row[1:]))  # fewer busy devices never run slower
    assert measured.busy_speedup == dict(measured.busy_speedup_by_size)[2.0 * 512 ** 3]
    cluster = av.Cluster.local(calibrate=True, cache_dir=shared_cache)
    assert cluster.busy_speedup_by_size == measured.busy_speedup_by_size
    smallest, largest = measured.busy_speedup_by_size[0], measured.busy_speedup_by_size[-1]
    assert cluster.speedup(1, smallest[0]) == pytest.approx(smallest[1][0])
    assert cluster.speedup(1, largest[0] * 10) == pytest.approx(largest[1][0])  # flat past the end
    assert "speedup at 4.19 MFLOP" in measured.describe()


def test_the_speedup_is_interpolated_between_sizes_and_checked():
    base = av.Cluster.local()
    cluster = av.Cluster(1, 2, base.device, base.intra_host, base.inter_host, busy_speedup=(3.0, 1.0),
                         busy_speedup_by_size=((1e6, (2.0, 1.0)), (1e8, (4.0, 1.0))))
    assert cluster.speedup(1, 1e7) == pytest.approx(3.0)  # halfway in log FLOPs
    assert cluster.speedup(1) == 3.0 and cluster.speedup(2, 1e7) == 1.0
    assert av.Plan.from_json(av.solve(*av.models.gpt(num_layers=1, hidden=32, seq_len=4, vocab=32, batch_size=4),
                                      cluster=cluster, progress=False).to_json()).cluster == cluster
    with pytest.raises(ValueError, match="one positive speedup per number of busy devices"):
        av.Cluster(1, 2, base.device, base.intra_host, base.inter_host, busy_speedup=(3.0, 1.0),
                   busy_speedup_by_size=((1e6, (2.0,)),))
    with pytest.raises(ValueError, match="increasing FLOPs"):
        av.Cluster(1, 2, base.device, base.intra_host, base.inter_host, busy_speedup=(3.0, 1.0),
                   busy_speedup_by_size=((1e8, (2.0, 1.0)), (1e6, (2.0, 1.0))))


def test_a_speedup_curve_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="one entry per number of busy devices"):
        av.Cluster(1, 4, av.Cluster.local().device, av.Cluster.local().intra_host,
                   av.Cluster.local().inter_host, busy_speedup=(2.0, 1.0))


def test_calibration_measures_the_rate_against_the_matmul_size(shared_cache):
    measured = calibrate(cache_dir=shared_cache)
    flops = [f for f, _ in measured.rate_curve]
    assert len(flops) == 4 and flops == sorted(flops) and measured.rate_curve[-1][1] == 1.0
    assert all(0 < share <= 3.0 for _, share in measured.rate_curve)
    cluster = av.Cluster.local(calibrate=True, cache_dir=shared_cache)
    assert cluster.device.rate_curve == measured.rate_curve
    assert "rate by matmul size" in measured.describe()
