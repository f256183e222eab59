"""The teacher server a distillation run starts is supervised: killed (SIGKILL), it is restarted on the same port and a
request made after the kill succeeds on the client's retries; past ``teacher.max_restarts`` it is left dead and the
reason (the count, the stderr log) is recorded; leaving ``teacher_endpoint`` leaves no server behind, one still
starting included. Real server processes on loopback, on a micro model built here."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from asyncrl.config import TeacherConfig
from asyncrl.teacher.client import TeacherClient
from asyncrl.teacher.launch import POLL_S, TeacherEndpoint, teacher_endpoint
from asyncrl.teacher.protocol import TeacherUnavailableError
from tests.helpers import make_data, make_model
from tests.test_faults import pids_of

TOKENS = [1, 2, 3, 4]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("teacher_restart")
    train, _ = make_data(root, size=32, test_size=4)
    return make_model(root, train, seed=7)


def config(teacher: Path, max_restarts: int) -> TeacherConfig:
    return TeacherConfig(model_path=str(teacher), max_restarts=max_restarts, server_max_batch=8, startup_timeout_s=60)


def servers_of(model_dir: Path) -> list[int]:
    """Live teacher server processes on ``model_dir`` (a reaped process has no /proc entry; a zombie no cmdline)."""
    return pids_of(f"asyncrl.teacher.server --model {model_dir} ")


def wait_for(what: str, ok, timeout_s: float = 60.0):  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = ok()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not within {timeout_s:g} s")


@pytest.mark.faults  # two server starts (~16 s): in make test-faults, to keep make test in budget
def test_a_killed_server_is_restarted_on_its_port_and_the_request_after_the_kill_succeeds(teacher, tmp_path):
    with teacher_endpoint(config(teacher, max_restarts=3), tmp_path) as endpoint:
        first = endpoint.pid
        # the default retries (3, from 0.5 s) wait for the restart (6-11 s here) before each try, as a run's client does
        wait = lambda: endpoint.wait_up(60)  # noqa: E731
        with TeacherClient(endpoint.url, top_k=4, before_retry=wait) as client:
            before = client.score(TOKENS)
            os.kill(first, signal.SIGKILL)
            t0 = time.monotonic()
            after = client.score(TOKENS)  # fails while the server is down, then succeeds on a retry (same URL)
            waited = time.monotonic() - t0
        restarts = wait_for("the restart recorded", lambda: endpoint.restarts)
        assert after.ids_TK.tolist() == before.ids_TK.tolist(), "the restarted server is the same teacher"
        assert len(restarts) == 1 and restarts[0].exit_code == -signal.SIGKILL
        assert restarts[0].pid == endpoint.pid != first and restarts[0].start_s < waited + POLL_S + 1
        assert endpoint.gave_up is None
        print(f"restart took {restarts[0].start_s:.1f} s; the request after the kill {waited:.1f} s")
        log = (tmp_path / "teacher_server.log").read_text()
        assert "exited with code -9; restart 1 of 3" in log
        second = endpoint.pid
    assert not servers_of(teacher), "leaving teacher_endpoint stops the server"
    time.sleep(3 * POLL_S)
    assert not servers_of(teacher) and len(endpoint.restarts) == 1, "a server stopped at exit is not restarted"
    assert second not in servers_of(teacher)


@pytest.mark.faults  # a server start each (~6 s): in make test-faults, to keep make test in budget
def test_past_max_restarts_the_server_stays_dead_and_the_client_names_the_url(teacher, tmp_path):
    with teacher_endpoint(config(teacher, max_restarts=0), tmp_path) as endpoint:
        os.kill(endpoint.pid, signal.SIGKILL)
        with TeacherClient(endpoint.url, top_k=4, max_retries=2, backoff_s=0.2) as client:
            with pytest.raises(TeacherUnavailableError, match=f"teacher at {endpoint.url} unreachable"):
                client.score(TOKENS)
        reason = wait_for("the supervisor giving up", lambda: endpoint.gave_up, timeout_s=5)
        assert "died once, more than teacher.max_restarts=0" in reason and "exit code -9" in reason
        assert str(tmp_path / "teacher_server.log") in reason
        assert endpoint.restarts == [] and not servers_of(teacher)


@pytest.mark.faults  # a server start each (~6 s): in make test-faults, to keep make test in budget
def test_a_restart_that_cannot_start_counts_as_a_death_and_does_not_loop(teacher, tmp_path):
    """The port is taken the moment the server dies: the restart exits at start-up (a death too), and with
    max_restarts=1 the supervisor then gives up instead of trying again."""
    with teacher_endpoint(config(teacher, max_restarts=1), tmp_path) as endpoint:
        port = int(endpoint.url.rsplit(":", 1)[1])
        squatter = socket.socket()
        try:
            os.kill(endpoint.pid, signal.SIGKILL)
            wait_for("the port free", lambda: _bound(squatter, port), timeout_s=2)  # before the new server can bind
            squatter.listen()
            reason = wait_for("the supervisor giving up", lambda: endpoint.gave_up)
        finally:
            squatter.close()
        assert "died 2 times, more than teacher.max_restarts=1" in reason
        (restart,) = endpoint.restarts
        assert restart.exit_code == -signal.SIGKILL and restart.pid is None
        assert "cannot listen on 127.0.0.1" in (tmp_path / "teacher_server.log").read_text()
        assert not servers_of(teacher)


def _bound(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:  # the killed server's socket is not closed yet
        return False
    return True


@pytest.mark.faults  # a server start each (~6 s): in make test-faults, to keep make test in budget
def test_leaving_during_a_restart_stops_the_server_being_started(teacher, tmp_path):
    with teacher_endpoint(config(teacher, max_restarts=3), tmp_path) as endpoint:
        first = endpoint.pid
        os.kill(first, signal.SIGKILL)
        wait_for("a new server spawned", lambda: endpoint.pid != first, timeout_s=5)  # still importing, not listening
    assert not servers_of(teacher), "the server that was starting is stopped too"
    time.sleep(3 * POLL_S)
    assert not servers_of(teacher) and endpoint.restarts == []


def test_a_given_url_has_no_supervisor():
    endpoint = TeacherEndpoint("http://127.0.0.1:9")
    assert (endpoint.pid, endpoint.restarts, endpoint.gave_up) == (None, [], None)


def test_the_server_socket_can_rebind_a_port_right_after_its_owner_died():
    """A restart binds the port its killed predecessor held, whose connections may sit in TIME_WAIT: SO_REUSEADDR
    (http.server sets it for every HTTPServer) lets it."""
    from asyncrl.teacher.transport import TeacherHTTPServer

    assert TeacherHTTPServer.allow_reuse_address
