"""PoolTurns (how PPO issues update_critic and update_actor): calls to roles on different pools run at once, calls to
roles sharing a pool take turns. Shown by cause, not by clocks: each call announces itself on a board and waits for
the other call to announce itself. Two calls that run at once meet; a call that runs alone never sees the other, since
PoolTurns does not start it before the first has returned. Both backends: worker objects on their own call threads
(in-process) and Ray actors on the session's local cluster."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from asyncrl.calls import Handle
from asyncrl.roles.clients import PoolTurns
from asyncrl.roles.placement import Placement, Pool
from asyncrl.workers.backends import LocalHandle

MEET_S = 60.0  # how long a call that should meet the other waits: only reached when it never comes (a failure)
ALONE_S = 0.5  # how long a call that must run alone waits for the other, before saying it did not see it


class Board:
    """Who has arrived. Thread-safe; one instance shared by both calls (in-process) or one Ray actor (Ray)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def arrive(self, name: str) -> None:
        with self.lock:
            self.seen.add(name)

    def has(self, name: str) -> bool:
        with self.lock:
            return name in self.seen


class Meeter:
    """A worker whose one call arrives on the board and waits (up to ``wait_s``) for ``other`` to arrive."""

    def __init__(self, board: object):
        self.board = board

    def _ask(self, method: str, name: str) -> bool | None:
        call = getattr(self.board, method)
        if hasattr(call, "remote"):  # the board is a Ray actor
            import ray

            return ray.get(call.remote(name))
        return call(name)

    def meet(self, me: str, other: str, wait_s: float) -> bool:
        self._ask("arrive", me)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self._ask("has", other):
                return True
            time.sleep(0.005)
        return False


@pytest.fixture(params=["in_process", pytest.param("ray", marks=pytest.mark.ray)])
def handles(request) -> Iterator[dict[str, Handle]]:
    """The actor's and the critic's workers, sharing one board; stopped afterwards (Ray: the actors killed, so none
    outlives the test on the session's cluster)."""
    made, board = _workers(request.param)
    try:
        yield made
    finally:
        for h in made.values():
            h.kill()
        if request.param == "ray":
            import ray

            ray.kill(board)


def _workers(backend: str) -> tuple[dict[str, Handle], object]:
    if backend == "in_process":
        board = Board()
        return {r: LocalHandle(Meeter(board), r) for r in ("actor", "critic")}, board
    import ray

    from asyncrl.config import RayConfig
    from asyncrl.workers.cluster import RayHandle, init_ray
    from tests.helpers import RAY_CPUS

    init_ray(RayConfig(num_cpus=RAY_CPUS))
    board = ray.remote(num_cpus=0)(Board).remote()
    meeter = ray.remote(num_cpus=0)(Meeter)
    return {r: RayHandle(meeter.remote(board), r) for r in ("actor", "critic")}, board


def _placement(critic_pool: str) -> Placement:
    pools = {"actor_pool": Pool(cpus=1), "critic_pool": Pool(cpus=1)}
    return Placement(pools=pools, roles={"actor": "actor_pool", "critic": critic_pool}, rollout=None)


def test_calls_to_roles_on_different_pools_run_at_once(handles):
    turns = PoolTurns(_placement("critic_pool"))
    turns.issue("critic", "critic", lambda: handles["critic"].call("meet", "critic", "actor", MEET_S))
    turns.issue("actor", "actor", lambda: handles["actor"].call("meet", "actor", "critic", MEET_S))
    assert turns.join() == {"critic": True, "actor": True}  # each saw the other while it ran


def test_calls_to_roles_sharing_a_pool_take_turns_in_the_order_issued(handles):
    turns = PoolTurns(_placement("actor_pool"))
    turns.issue("critic", "critic", lambda: handles["critic"].call("meet", "critic", "actor", ALONE_S))
    turns.issue("actor", "actor", lambda: handles["actor"].call("meet", "actor", "critic", ALONE_S))
    # the critic's call ran alone (the actor's had not started), the actor's found the critic's already there
    assert turns.join() == {"critic": False, "actor": True}
