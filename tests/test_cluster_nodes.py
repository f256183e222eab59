"""GPU-shaped plans on a real Ray cluster of several nodes (``ray.cluster_utils.Cluster`` on loopback).

Every node is a real raylet with its own address (127.0.0.2, 127.0.0.3, ...: all loopback, so a store bound to a
node's address is reachable and the address says which node it is) and declared GPUs, so Ray assigns GPU ids and
``CUDA_VISIBLE_DEVICES`` as on GPU nodes. There is no CUDA here: each role's ``trainer.device=auto`` resolves to the
CPU, and the run completes. What this shows: each role's node and GPUs are as planned, the pools are disjoint, the
trainer's ranks span two nodes, and the stores' hosts came from Ray's node addresses (never a loopback constant).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.schedules import run_training
from tests.helpers import make_data, make_model, train_overrides

pytestmark = pytest.mark.ray
QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"

# trainer: 2 nodes x 1 GPU (127.0.0.2, 127.0.0.3); rollout: 1 node x 2 GPUs (127.0.0.4)
NODES = [("127.0.0.2", 1), ("127.0.0.3", 1), ("127.0.0.4", 2)]


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    os.environ["RAY_worker_niceness"] = (
        "0"  # as init_ray: workers at Ray's default niceness 15 starve beside other tests
    )
    ray.shutdown()  # the session's local cluster, if a test before started one
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        for ip, gpus in NODES:
            c.add_node(num_cpus=2, num_gpus=gpus, node_ip_address=ip)
        c.wait_for_nodes()
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("nodes")
    train, test = make_data(root)
    return root, make_model(root, train), train, test


def _run(cluster, setup, name: str, *extra: str) -> dict:
    root, model, train, test = setup
    run_dir = root / name
    over = train_overrides(model, train, test, run_dir, 2) + [
        f"ray.address={cluster.address}",
        "ray.num_cpus=null",
        "trainer.cpus_per_worker=1",
        "rollout.cpus_per_worker=1",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        "weight_sync.timeout_s=60",
        *extra,
    ]
    summary = run_training(load_config(None, over))
    assert summary["steps"] == 2
    return json.loads((run_dir / "summary.json").read_text())["placement"]


def _check_trainer(placement: dict, nodes: set[str]) -> None:
    workers = {w["name"]: w for w in placement["workers"]}
    ranks = [workers["trainer"], workers["trainer.rank1"]]
    assert {w["address"] for w in ranks} == nodes  # one rank on each of two GPU nodes
    assert all(len(w["gpu_ids"]) == 1 and w["cuda_visible_devices"] == w["gpu_ids"][0] for w in ranks)
    assert all(w["device"] == "cpu" for w in placement["workers"])  # declared GPUs, no CUDA: auto is the CPU
    # the stores live on the sending rank's node, at the address Ray reports for it
    for group in ("trainer_data_parallel", "weight_sync"):
        assert placement["rendezvous"][group].split(":")[0] == workers["trainer"]["address"], group
    assert workers["trainer"]["address"] != "127.0.0.1"


def test_one_step_off_places_two_trainer_nodes_and_a_two_gpu_rollout_node(cluster, setup):
    placement = _run(
        cluster, setup, "osp", "trainer.schedule=one_step_off", "rollout.nnodes=1", "rollout.n_gpus_per_node=2"
    )
    _check_trainer(placement, {"127.0.0.2", "127.0.0.3"})  # the 2-GPU node is the rollout's: the only fit
    workers = {w["name"]: w for w in placement["workers"]}
    rollouts = [workers["rollout0"], workers["rollout1"]]
    assert {w["address"] for w in rollouts} == {"127.0.0.4"}
    gpus = [w["gpu_ids"] for w in rollouts]
    assert all(len(g) == 1 for g in gpus) and gpus[0] != gpus[1]  # a GPU each
    # the pools are disjoint: no (node, GPU) is held by two workers
    held = [(w["node_id"], g) for w in placement["workers"] for g in w["gpu_ids"]]
    assert len(held) == len(set(held)) == 4
    assert placement["pools"]["trainer"]["nodes"] == 2 and placement["pools"]["rollout"]["gpus"] == 2.0


def test_fully_async_drives_two_rollout_ranks_on_a_two_gpu_node(cluster, setup):
    """One Rollouter (rollout rank 0) and its other rank, a GPU each on the rollout's node; the trainer's ranks on the
    two others; the weight sync reaches both rollout ranks (the run completes its syncs)."""
    placement = _run(
        cluster,
        setup,
        "fa",
        "trainer.schedule=fully_async",
        "rollout.n_gpus_per_node=2",
        "async_training.staleness_threshold=1",
    )
    _check_trainer(placement, {"127.0.0.2", "127.0.0.3"})
    workers = {w["name"]: w for w in placement["workers"]}
    ranks = [workers["rollouter"], workers["rollout1"]]
    assert {w["address"] for w in ranks} == {"127.0.0.4"}
    assert all(len(w["gpu_ids"]) == 1 for w in ranks) and ranks[0]["gpu_ids"] != ranks[1]["gpu_ids"]
    held = [(w["node_id"], g) for w in placement["workers"] for g in w["gpu_ids"]]
    assert len(held) == len(set(held)) == 4


def test_a_plan_larger_than_the_cluster_fails_at_once_with_one_line(cluster, setup, capsys):
    from asyncrl.cli import main

    root, model, train, test = setup
    over = train_overrides(model, train, test, root / "big", 2) + [
        f"ray.address={cluster.address}",
        "ray.num_cpus=null",
        "trainer.schedule=one_step_off",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=2",  # 4 GPUs on 2 nodes: no node has 2 free beside the rollout's
        "rollout.n_gpus_per_node=2",
    ]
    with pytest.raises(SystemExit) as exit:
        main(["train", "--config", str(QUICKSTART), *over])
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("asyncrl train: error:")]
    assert exit.value.code == 2 and len(lines) == 1
    assert "the roles ask for 6 GPUs" in lines[0] and "the Ray cluster has 4" in lines[0]


LOCAL_RUN = """
import json, sys, ray
from asyncrl.config import RayConfig
from asyncrl.workers.cluster import init_ray
init_ray(RayConfig(address=sys.argv[1] or None, num_cpus=1))
print(json.dumps({"gcs": ray.get_runtime_context().gcs_address, "gpus": ray.cluster_resources().get("GPU", 0)}))
ray.shutdown()
"""


def test_ray_address_auto_joins_the_running_cluster_and_none_starts_a_private_one(cluster, tmp_path):
    """``ray.address: auto`` joins the cluster running on this machine; no address starts a private one even then
    (Ray on its own would join the running cluster; its `ray.init(num_cpus=...)` then fails)."""
    from ray._common.utils import get_ray_address_file
    from ray._private.utils import write_ray_address

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    (tmp_path / "run.py").write_text(LOCAL_RUN)
    # what `ray start --head` leaves for `auto` to find (other tests' private clusters may run beside this one)
    bootstrap = Path(get_ray_address_file(None))
    before = bootstrap.read_text() if bootstrap.exists() else None
    write_ray_address(cluster.address)
    got = {}
    try:
        for address in ("auto", ""):
            out = subprocess.run(
                [sys.executable, str(tmp_path / "run.py"), address],
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert out.returncode == 0, out.stderr[-2000:]
            got[address] = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        bootstrap.write_text(before) if before is not None else bootstrap.unlink(missing_ok=True)
    assert got["auto"]["gcs"] == cluster.address and got["auto"]["gpus"] == 4.0
    assert got[""]["gcs"] != cluster.address and got[""]["gpus"] == 0.0
