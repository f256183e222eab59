"""Placement as config: every bad mapping fails at start (before any worker), naming the key at fault."""

from __future__ import annotations

import pytest

from asyncrl.algorithms import algorithm_class
from asyncrl.config import load_config
from asyncrl.roles.placement import NodeCapacity, PlacementError, Pool, resolve_placement

BASE = ["model.path=m", "data.train_files=[t.parquet]", "algorithm.name=ppo", "algorithm.adv_estimator=gae"]
SPLIT = [
    "placement.pools.a.cpus=1",
    "placement.pools.c.cpus=1",
    "placement.roles.actor=a",
    "placement.roles.critic=c",
]


def _resolve(*over: str, cpus: float = 2.0, nodes: list[NodeCapacity] | None = None):
    """As a run of that config places its roles: the algorithm's roles, a rollout pool for any schedule but sync,
    on a cluster of one node of ``cpus`` CPUs (or of ``nodes``)."""
    cfg = load_config(None, BASE + list(over))
    needed = algorithm_class(cfg).roles_needed(cfg)
    cluster = nodes if nodes is not None else [NodeCapacity("127.0.0.1", cpus)]
    return resolve_placement(cfg, needed, cfg.trainer.schedule != "sync", cluster)


def test_empty_placement_puts_every_role_on_the_trainer_pool():
    p = _resolve("trainer.cpus_per_worker=2", cpus=2)
    assert p.pools == {"trainer": Pool(cpus=2.0)} and p.roles == {"actor": "trainer", "critic": "trainer"}
    assert p.rollout is None  # sync: the actor generates
    p = _resolve("reward_model.enable=true", "reward_model.path=rm", "trainer.cpus_per_worker=1", cpus=4)
    assert p.roles == {"actor": "trainer", "critic": "trainer", "reward_model": "trainer"}


def test_placement_holds_in_every_schedule_and_the_rollout_pool_counts():
    p = _resolve(
        *SPLIT, "trainer.schedule=one_step_off", "rollout.num_workers=2", "rollout.cpus_per_worker=0.5", cpus=3
    )
    assert not p.same_pool("actor", "critic") and p.rollout == Pool(cpus=1.0, ranks=2) and p.total_cpus == 3.0
    assert p.slot("rollout:1").cpus == 0.5 and p.slot("actor").pool == "a"
    with pytest.raises(PlacementError, match=r"ask for 3 CPUs \(a=1 CPUs, c=1 CPUs, rollout=1 CPUs\)"):
        _resolve(*SPLIT, "trainer.schedule=fully_async", cpus=2)


def test_explicit_split_and_colocated_mappings_resolve():
    p = _resolve(*SPLIT)
    assert not p.same_pool("actor", "critic")
    p = _resolve("placement.pools.all.cpus=2", "placement.roles={actor: all, critic: all}")
    assert p.same_pool("actor", "critic") and p.roles_on("all") == ["actor", "critic"]


@pytest.mark.parametrize(
    "extra, cpus, fragment",
    [
        (["placement.roles.judge=a"], 2, "placement.roles.judge: unknown role"),
        (["placement.roles.critic=nowhere"], 2, "placement.roles.critic: pool 'nowhere' is not in placement.pools"),
        (["placement.pools.spare.cpus=1"], 3, "placement.pools.spare: empty pool"),
        (["placement.pools.c.cpus=0"], 2, "placement.pools.c.cpus must be > 0"),
        ([], 1.5, "the roles ask for 2 CPUs (a=1 CPUs, c=1 CPUs) but the Ray cluster has 1.5"),
        (["placement.roles.ref=c"], 2, "placement.roles.ref: not a placed role (the reference model lives in"),
        (["placement.roles.rollout=a"], 2, "placement.roles.rollout: not a placed role (the schedule places"),
    ],
)
def test_invalid_mapping_is_a_clear_error(extra, cpus, fragment):
    with pytest.raises(PlacementError, match=None) as e:
        _resolve(*SPLIT, *extra, cpus=cpus)
    assert fragment in str(e.value)


def test_a_role_without_a_pool_is_named():
    with pytest.raises(PlacementError, match="placement.roles.critic: missing"):
        _resolve("placement.pools.a.cpus=2", "placement.roles={actor: a}")
    with pytest.raises(PlacementError, match="placement.roles.reward_model: missing"):
        _resolve(*SPLIT, "reward_model.enable=true", "reward_model.path=rm")


def test_a_reward_model_role_is_ignored_when_the_reward_model_is_off():
    p = _resolve(*SPLIT, "placement.roles.reward_model=c")
    assert "reward_model" not in p.roles


def test_bad_ppo_config_values_name_the_key():
    from asyncrl.algorithms import check_config
    from asyncrl.config import ConfigError

    with pytest.raises(ConfigError, match="algorithm.adv_estimator must be gae or null when algorithm.name=ppo"):
        check_config(load_config(None, BASE + ["algorithm.adv_estimator=grpo"]))
    with pytest.raises(ConfigError, match="algorithm.lam must be in"):
        load_config(None, BASE + ["algorithm.lam=1.5"])
    with pytest.raises(ConfigError, match="reward_model.path must be a model directory"):
        load_config(None, BASE + ["reward_model.enable=true"])
    with pytest.raises(ConfigError, match="unknown config key 'placement.pools.a.tpus'"):
        load_config(None, BASE + ["placement.pools.a.tpus=1"])


# ---- GPU-shaped plans in verl's keys (no GPU needed: placement is arithmetic on the cluster's nodes) ------------
GRPO = ["model.path=m", "data.train_files=[t.parquet]", "trainer.schedule=one_step_off"]
VERL_KEYS = ["trainer.nnodes=2", "trainer.n_gpus_per_node=1", "rollout.nnodes=1", "rollout.n_gpus_per_node=2"]


def _gpu_nodes(*gpus: int, cpus: float = 4.0) -> list[NodeCapacity]:
    return [NodeCapacity(f"127.0.0.{i + 2}", cpus, float(g)) for i, g in enumerate(gpus)]


def _resolve_grpo(*over: str, nodes: list[NodeCapacity]):
    cfg = load_config(None, GRPO + list(over))
    return cfg, resolve_placement(cfg, algorithm_class(cfg).roles_needed(cfg), True, nodes)


def test_verl_node_and_gpu_keys_size_the_trainer_and_the_rollout_pool():
    cfg, p = _resolve_grpo(*VERL_KEYS, nodes=_gpu_nodes(1, 1, 2))
    assert cfg.trainer.num_workers == 2 and cfg.rollout.num_workers == 2  # one rank per GPU
    assert p.pools["trainer"] == Pool(cpus=2.0, gpus=1.0, nodes=2, ranks=2)
    assert p.rollout == Pool(cpus=2.0, gpus=2.0, nodes=1, ranks=2)
    assert [p.slot("actor", r).node for r in range(2)] == [0, 1]  # a rank on each of the pool's two nodes
    assert all(p.slot("actor", r).gpus == 1.0 for r in range(2))
    assert [(p.slot(f"rollout:{i}").node, p.slot(f"rollout:{i}").gpus) for i in range(2)] == [(0, 1.0), (0, 1.0)]
    assert p.total_gpus == 4.0


def test_a_tensor_parallel_engine_reserves_its_gpus_on_one_node():
    """verl's keys with rollout.tensor_model_parallel_size=2: 2 nodes x 4 rollout GPUs are 4 engines, each asking
    Ray for 2 GPUs of one node."""
    tp = ["rollout.engine=vllm", "rollout.tensor_model_parallel_size=2"]
    tp += ["rollout.nnodes=2", "rollout.n_gpus_per_node=4"]
    cfg, p = _resolve_grpo("trainer.n_gpus_per_node=1", *tp, nodes=_gpu_nodes(1, 4, 4))
    assert cfg.rollout.num_workers == 4 and p.rollout == Pool(cpus=2.0, gpus=4.0, nodes=2, ranks=4)
    assert [(p.slot(f"rollout:{i}").node, p.slot(f"rollout:{i}").gpus) for i in range(4)] == [
        (0, 2.0), (0, 2.0), (1, 2.0), (1, 2.0)
    ]  # fmt: skip
    from asyncrl.config import ConfigError

    with pytest.raises(ConfigError, match=r"rollout.tensor_model_parallel_size must be a divisor of rollout.n_gpus"):
        load_config(None, GRPO + [*tp[:2], "rollout.n_gpus_per_node=3"])
    with pytest.raises(ConfigError, match=r"rollout.tensor_model_parallel_size must be 1 with the builtin engine"):
        load_config(None, GRPO + ["rollout.tensor_model_parallel_size=2"])


def test_cpu_ranks_spread_over_nodes_and_colocated_roles_split_a_gpu():
    cfg, p = _resolve_grpo("trainer.nnodes=2", "trainer.num_workers=4", nodes=_gpu_nodes(0, 0, cpus=8))
    assert p.pools["trainer"] == Pool(cpus=4.0, nodes=2, ranks=4)
    assert [p.slot("actor", r).node for r in range(4)] == [0, 0, 1, 1] and p.slot("actor", 3).threads == 2
    p = _resolve("trainer.n_gpus_per_node=1", nodes=_gpu_nodes(1))  # ppo: actor and critic share the one GPU
    assert p.slot("actor").gpus == 0.5 and p.slot("critic").gpus == 0.5


@pytest.mark.parametrize(
    "over, fragment",
    [
        (["trainer.nnodes=2", "trainer.n_gpus_per_node=1", "trainer.num_workers=3"], "trainer.num_workers must be 2"),
        (["trainer.nnodes=2", "trainer.num_workers=3"], "a multiple of trainer.nnodes (2)"),
        (["trainer.backend=in_process", "rollout.n_gpus_per_node=1"], "rollout.n_gpus_per_node must be 0 with"),
        (["trainer.schedule=sync", "rollout.n_gpus_per_node=1"], "trainer.schedule=sync generates on the trainer"),
        (["trainer.device=tpu"], "trainer.device must be one of auto, cpu, cuda"),
    ],
)
def test_inconsistent_node_and_gpu_keys_name_the_key(over, fragment):
    from asyncrl.config import ConfigError

    with pytest.raises(ConfigError) as e:
        load_config(None, GRPO + over)
    assert fragment in str(e.value)


@pytest.mark.parametrize(
    "nodes, fragment",
    [
        (_gpu_nodes(1, 1, 1), "the roles ask for 4 GPUs"),  # 3 GPUs in all
        (_gpu_nodes(4, 0), "pool 'trainer' needs 2 node(s) with 2 CPUs and 1 GPUs each"),  # one GPU node
        (_gpu_nodes(2, 2), "each fit the Ray cluster but not all together"),  # 4 GPUs, yet no node for the rollout
        (_gpu_nodes(1, 1, 1, 1), "pool 'rollout' needs 1 node(s) with 2 CPUs and 2 GPUs"),  # no node has 2
        (_gpu_nodes(1, 1, 2, cpus=1), "the roles ask for 6 CPUs"),
    ],
)
def test_a_plan_the_cluster_cannot_hold_fails_naming_what_is_missing(nodes, fragment):
    with pytest.raises(PlacementError) as e:
        _resolve_grpo(*VERL_KEYS, nodes=nodes)
    assert fragment in str(e.value)


def test_several_gpu_ranks_per_node_do_not_share_their_pool_with_another_role():
    with pytest.raises(PlacementError, match="critic shares the actor's pool 'trainer'"):
        _resolve("trainer.n_gpus_per_node=2", nodes=_gpu_nodes(2, cpus=8))


def test_the_weight_sync_uses_nccl_only_between_workers_on_gpus_of_their_own():
    from asyncrl.comm.transport import WorkerLocation, process_group_transport, transport_of

    pids = iter(range(100, 200))

    def at(device: str, node: str = "n1", gpus: tuple[str, ...] = (), pid: int | None = None) -> WorkerLocation:
        return WorkerLocation("w", "10.0.0.1", node, gpus, ",".join(gpus) or None, device, pid or next(pids))

    assert transport_of([at("cuda:0", "n1", ("0",)), at("cuda:0", "n2", ("0",)), at("cuda:0", "n1", ("1",))]) == "nccl"
    assert transport_of([at("cuda:0", "n1", ("0",)), at("cuda:0", "n1", ("0",))]) == "gloo"  # one GPU, two ranks
    assert transport_of([at("cuda:0"), at("cuda:0")]) == "gloo"  # two processes on one node, no GPU of their own
    assert transport_of([at("cuda:0", "local", pid=7), at("cuda:0", "local", pid=7)]) == "local"  # in-process
    assert transport_of([at("cpu", "n1", ("0",)), at("cuda:0", "n2", ("0",))]) == "gloo"  # a CPU worker
    # data-parallel ranks need a real process group: in one process they go through the host
    assert process_group_transport([at("cuda:0", "local", pid=7), at("cuda:0", "local", pid=7)]) == "gloo"
    assert process_group_transport([at("cuda:0", "n1", ("0",)), at("cuda:0", "n2", ("0",))]) == "nccl"
