"""The local Ray cluster binds 127.0.0.1 only. Runs in a fresh interpreter without the loopback variable that
tests/conftest.py sets, as `asyncrl train` runs: `ray` is imported before init_ray sets it (real cluster)."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, ray
from asyncrl.config import RayConfig
from asyncrl.workers.cluster import init_ray
init_ray(RayConfig(num_cpus=1))

@ray.remote
def where():
    return ray.util.get_node_ip_address()

got = {
    "nodes": [n["NodeManagerAddress"] for n in ray.nodes()],
    "gcs": ray.get_runtime_context().gcs_address,
    "task": ray.get(where.remote()),
}
# a second run reuses the cluster; one asking for other CPUs gets a new one; a cluster the caller started is theirs
node = lambda: ray.get_runtime_context().get_node_id()
first = node()
init_ray(RayConfig(num_cpus=1))
got["reused"] = node() == first
init_ray(RayConfig(num_cpus=2))
got["restarted"] = [node() != first, ray.cluster_resources()["CPU"]]
ray.shutdown()
ray.init(address="local", num_cpus=1, include_dashboard=False)
theirs = node()
init_ray(RayConfig(num_cpus=2))
got["theirs_kept"] = [node() == theirs, ray.cluster_resources()["CPU"]]
ray.shutdown()
print(json.dumps(got))
"""


@pytest.mark.ray
def test_local_cluster_binds_loopback_even_when_ray_was_imported_first_and_is_reused_by_a_second_run():
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["nodes"] == ["127.0.0.1"]
    assert got["gcs"].startswith("127.0.0.1:")
    assert got["task"] == "127.0.0.1"
    assert got["reused"] is True
    assert got["restarted"] == [True, 2.0]
    assert got["theirs_kept"] == [True, 1.0]
