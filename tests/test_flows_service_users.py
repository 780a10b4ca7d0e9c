"""Two real local users (made here with useradd) against one root flow service: each sees,
changes and reads only their own handles, payloads and outputs; instances run as their user;
links a user plants in their own area never make root touch anything outside it.

Each user's requests are made by a forked child that has become that user before it
connects: the service knows callers only by the kernel's peer credentials.
"""

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterator

import pytest

from psij.flows.client import FlowClient, FlowError
from support.flow_helpers import Service, wait_for
from support.local_users import User, make_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                                reason="needs root and useradd to make the test users")


@pytest.fixture(scope="module")
def users() -> Iterator[Dict[str, User]]:
    made = {"alice": make_user("psijfa"), "bob": make_user("psijfb")}
    yield made
    for user in made.values():
        subprocess.run(["userdel", user.name], capture_output=True)


@pytest.fixture
def root_service() -> Iterator[Service]:
    top = Path(tempfile.mkdtemp(prefix="psij-flow-users-"))
    os.chmod(top, 0o755)
    svc = Service(top / "state", str(top / "run" / "flow.sock"), single_user=False)
    svc.start()
    yield svc
    svc.stop()
    shutil.rmtree(top, ignore_errors=True)


def as_user(user: User, socket_path: str, work: Callable[[FlowClient], Any]) -> Any:
    """``work(client)`` in a child that is ``user`` (no supplementary groups); its result
    (JSON) or ``{"error": code}`` for a FlowError."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(user.gid)
            os.setuid(user.uid)
            try:
                with FlowClient(socket_path, timeout=30) as client:
                    result = work(client)
            except FlowError as ex:
                result = {"error": ex.code, "message": ex.message}
            except OSError as ex:
                result = {"oserror": ex.errno}
            os.write(write, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write)
    data = b""
    while True:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(data)


def _spec() -> Dict[str, Any]:
    return {"executable": "payload", "arguments": []}


def test_two_users_see_change_and_read_only_their_own(users: Dict[str, User],
                                                      root_service: Service) -> None:
    alice, bob = users["alice"], users["bob"]
    sock = root_service.socket
    script = b"#!/bin/sh\necho uid=$(id -u) home=$HOME; sleep 1\n"
    made = as_user(alice, sock, lambda c: {
        "sha": c.upload(script),
        "handle": c.create(_spec(), 1, "local", payload=c.upload(script), lease=120,
                           provisioning_lease=60)["handle"]})
    handle, sha = made["handle"], made["sha"]

    ended = wait_for("alice's instance ended", lambda: as_user(
        alice, sock, lambda c: [i for i in c.instances(handle) if i.get("ended")]), timeout=30)
    first = ended[0]["id"]
    out = as_user(alice, sock, lambda c: c.output(handle, first))
    assert out.startswith(f"uid={alice.uid} "), out  # ran as alice, not root

    # Bob sees nothing of alice's and can change nothing.
    assert as_user(bob, sock, lambda c: c.list()) == []
    for work in (lambda c: c.status(handle), lambda c: c.grow(handle, 1),
                 lambda c: c.shrink(handle, 1), lambda c: c.renew(handle, 60, 30),
                 lambda c: c.instances(handle), lambda c: c.output(handle, first),
                 lambda c: c.delete(handle, [first]), lambda c: c.destroy(handle),
                 lambda c: c.problems(handle)):
        assert as_user(bob, sock, work)["error"] == "unknown_handle"
    refused = as_user(bob, sock, lambda c: c.create(_spec(), 1, "local", payload=sha,
                                                    lease=60, provisioning_lease=30))
    assert refused["error"] == "refused" and "payload" in refused["message"], refused

    # Nor can bob read alice's files directly.
    area = root_service.state_dir / "areas" / str(alice.uid)
    sandbox = area / handle
    outputs = [p.name for p in sandbox.iterdir() if p.name.endswith(".out")]
    assert outputs

    def read_directly(client: FlowClient) -> Any:
        results = {}
        for path in (area / "payloads" / sha, sandbox / outputs[0]):
            try:
                results[str(path)] = Path(path).read_text()
            except OSError as ex:
                results[str(path)] = f"errno {ex.errno}"
        try:
            results["list"] = str(os.listdir(root_service.state_dir / "areas"))
        except OSError as ex:
            results["list"] = f"errno {ex.errno}"
        return results

    for path, text in as_user(bob, sock, read_directly).items():
        assert text.startswith("errno 13"), (path, text)
    assert as_user(alice, sock, lambda c: c.status(handle))["valid"] is True
    as_user(alice, sock, lambda c: c.destroy(handle))
    assert as_user(alice, sock, lambda c: c.status(handle))["valid"] is False


def test_links_planted_by_a_user_never_reach_outside_their_area(
        users: Dict[str, User], root_service: Service) -> None:
    alice = users["alice"]
    sock = root_service.socket
    secret = Path(tempfile.mkdtemp(prefix="psij-flow-secret-"))
    (secret / "shadow").write_text("root only\n")
    os.chmod(secret / "shadow", 0o600)
    try:
        area = root_service.state_dir / "areas" / str(alice.uid)
        first = as_user(alice, sock, lambda c: c.upload(b"#!/bin/sh\necho hi\n"))
        assert len(first) == 64

        def plant(client: FlowClient) -> Any:
            payloads = area / "payloads"
            for name in os.listdir(payloads):
                os.unlink(payloads / name)
            os.rmdir(payloads)
            os.symlink(str(secret), payloads)
            return client.upload(b"#!/bin/sh\necho planted\n")

        assert as_user(alice, sock, plant)["error"] == "store_failed"
        assert sorted(os.listdir(secret)) == ["shadow"]

        handle = as_user(alice, sock, lambda c: c.create(
            {"executable": "/bin/echo", "arguments": ["x"]}, 1, "local", lease=60,
            provisioning_lease=30)["handle"])
        ended = wait_for("an ended instance", lambda: as_user(
            alice, sock, lambda c: [i for i in c.instances(handle) if i.get("ended")]))
        instance = ended[0]["id"]

        def swap(client: FlowClient) -> Any:
            sandbox = area / handle
            for name in os.listdir(sandbox):
                if name.endswith(".out"):
                    os.unlink(sandbox / name)
                    os.symlink(str(secret / "shadow"), sandbox / name)
            return client.output(handle, instance)

        answer = as_user(alice, sock, swap)
        assert answer["error"] == "output_unavailable", answer
        assert (secret / "shadow").read_text() == "root only\n"
        as_user(alice, sock, lambda c: c.destroy(handle))
    finally:
        shutil.rmtree(secret, ignore_errors=True)


@pytest.mark.parametrize("name", [pytest.param("slurm", marks=pytest.mark.slurm),
                                  pytest.param("sge", marks=pytest.mark.sge)])
def test_a_users_instances_run_as_them_on_a_batch_scheduler(
        name: str, users: Dict[str, User], root_service: Service) -> None:
    alice = users["alice"]
    sock = root_service.socket
    spec = {"executable": "/bin/sh", "arguments": ["-c", "echo uid=$(id -u) gid=$(id -g)"],
            "attributes": {"duration": 60}}
    handle = as_user(alice, sock, lambda c: c.create(spec, 1, name, lease=60,
                                                     provisioning_lease=30)["handle"])
    try:
        ended = wait_for("an ended instance", lambda: as_user(
            alice, sock, lambda c: [i for i in c.instances(handle) if i.get("ended")]),
            timeout=60)
        out = as_user(alice, sock, lambda c: c.output(handle, ended[0]["id"]))
        assert out == f"uid={alice.uid} gid={alice.gid}\n", out
    finally:
        as_user(alice, sock, lambda c: c.destroy(handle))
