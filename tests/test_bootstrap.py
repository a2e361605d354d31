"""bootstrap/ on its own: the job secret, a real sshd on loopback checked by the real readiness
code (paramiko), the completion channel's authentication, and the peer process's deadlines."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, clean_env

from bootstrap import hosts, keys, readiness, sshd
from bootstrap.runtime import NodeFiles, runtime_root, ssh_client_args
from launchers.platform.cluster import free_port

needs_sshd = pytest.mark.skipif(sshd.sshd_binary() is None, reason="needs openssh-server (sshd)")


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    directory = tmp_path / "secret"
    keys.generate(directory)
    return directory


@pytest.fixture
def layout() -> Iterator[NodeFiles]:
    """A runtime directory where sshd's StrictModes holds (not under the world-writable /tmp)."""
    path = runtime_root(os.environ) / f"test-bootstrap-{secrets.token_hex(4)}"
    yield NodeFiles(path)
    sshd.stop(NodeFiles(path))
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def running_sshd(secret: Path, layout: NodeFiles) -> Iterator[tuple[NodeFiles, int]]:
    keys.install(secret, layout)
    port = free_port()
    pid = sshd.start(layout, port, ["127.0.0.1"])
    assert pid > 0
    yield layout, port
    assert sshd.stop(layout)
    assert not layout.sshd_pid.exists()


# ----------------------------------------------------------------------------------------
# The secret and its installation
# ----------------------------------------------------------------------------------------


def test_install_copies_the_secret_private_and_pins_the_host_key(secret: Path, layout: NodeFiles) -> None:
    for path in secret.iterdir():
        os.chmod(path, 0o644)  # as a mounted Kubernetes Secret may look
    installed = keys.install(secret, layout)
    assert stat.S_IMODE(layout.dir.stat().st_mode) == 0o700
    for path in (layout.client_key, layout.host_key, layout.authorized_keys, layout.known_hosts):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert layout.known_hosts.read_text().split()[0] == "mlaunch-job"
    assert installed.host_public.split()[1] == layout.known_hosts.read_text().split()[2]
    keys.remove_secrets(layout)
    assert not layout.client_key.exists() and not layout.host_key.exists() and layout.known_hosts.exists()


def test_problems_name_what_is_missing(tmp_path: Path, secret: Path) -> None:
    assert keys.problems(secret) == []
    assert keys.problems(tmp_path / "none") == [f"{tmp_path / 'none'} is not a directory"]
    (secret / "authorized_keys").unlink()
    (secret / "id_ed25519").write_text("not a key")
    found = " | ".join(keys.problems(secret))
    assert "lacks authorized_keys" in found and "id_ed25519 is not a private key" in found


def test_sshd_config_is_key_only() -> None:
    text = sshd.render_config(NodeFiles(Path("/run/x")), 36666, ["10.0.0.1"], "root")
    for line in (
        "Port 36666",
        "ListenAddress 10.0.0.1",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes yes",
        "PermitRootLogin prohibit-password",
        "AllowUsers root",
        "AuthorizedKeysFile /run/x/authorized_keys",
        "HostKey /run/x/ssh_host_ed25519_key",
        "AllowTcpForwarding no",
    ):
        assert line in text.splitlines(), line
    assert "PermitRootLogin no" in sshd.render_config(NodeFiles(Path("/run/x")), 1, ["0.0.0.0"], "mpiuser")
    with pytest.raises(sshd.SshdError):
        sshd.render_config(NodeFiles(Path("/run/x")), 1, ["0.0.0.0"], "bad\nuser")


@needs_sshd
def test_readiness_logs_in_with_the_job_key(running_sshd: tuple[NodeFiles, int]) -> None:
    layout, port = running_sshd
    statuses = readiness.wait_for_peers(
        ["127.0.0.1", "localhost"],
        port,
        sshd.current_user(),
        readiness.load_client_key(layout.client_key),
        readiness.load_pinned_host_key(layout.known_hosts),
        10,
    )
    assert all(s.ready for s in statuses.values())
    assert statuses["localhost"].address in ("127.0.0.1", "::1")


@needs_sshd
def test_readiness_refuses_another_host_key_at_once(running_sshd: tuple[NodeFiles, int], tmp_path: Path) -> None:
    layout, port = running_sshd
    rogue = tmp_path / "rogue"
    keys.generate(rogue)
    (tmp_path / "kh").write_text(keys.known_hosts_line((rogue / "ssh_host_ed25519_key.pub").read_text()))
    started = time.monotonic()
    with pytest.raises(readiness.PeersNotReady, match=r"refused to trust 1 host\(s\): 127.0.0.1: presented host key"):
        readiness.wait_for_peers(
            ["127.0.0.1"],
            port,
            sshd.current_user(),
            readiness.load_client_key(layout.client_key),
            readiness.load_pinned_host_key(tmp_path / "kh"),
            30,
        )
    assert time.monotonic() - started < 10  # a security failure is not retried until the deadline


@needs_sshd
def test_readiness_refuses_a_key_sshd_does_not_know(running_sshd: tuple[NodeFiles, int], tmp_path: Path) -> None:
    layout, port = running_sshd
    rogue = tmp_path / "rogue"
    keys.generate(rogue)
    with pytest.raises(readiness.PeersNotReady, match=r"refused the job key"):
        readiness.wait_for_peers(
            ["127.0.0.1"],
            port,
            sshd.current_user(),
            readiness.load_client_key(rogue / "id_ed25519"),
            readiness.load_pinned_host_key(layout.known_hosts),
            30,
        )


def test_readiness_names_the_hosts_that_never_answered() -> None:
    """A closed port and an unresolvable name: one deadline, both named (no sshd needed)."""
    started = time.monotonic()
    closed = free_port()
    with pytest.raises(readiness.PeersNotReady) as err:
        readiness.wait_for_peers(
            ["127.0.0.1", "no-such-host.invalid"],
            closed,
            "root",
            None,  # never used: no host gets as far as a handshake
            None,
            1.5,
        )
    elapsed = time.monotonic() - started
    message = str(err.value)
    assert "2 of 2 host(s) never accepted an ssh login" in message
    assert "127.0.0.1 (connection refused" in message and "no-such-host.invalid (name does not resolve" in message
    assert 1.4 < elapsed < 4


@needs_sshd
def test_password_login_is_refused(running_sshd: tuple[NodeFiles, int]) -> None:
    import paramiko

    _, port = running_sshd
    transport = paramiko.Transport(socket.create_connection(("127.0.0.1", port), timeout=5))
    try:
        transport.start_client(timeout=5)
        with pytest.raises(paramiko.BadAuthenticationType) as err:
            transport.auth_password(sshd.current_user(), "password")
        assert err.value.allowed_types == ["publickey"]
    finally:
        transport.close()


@needs_sshd
def test_openssh_client_with_mlaunch_options(running_sshd: tuple[NodeFiles, int], tmp_path: Path) -> None:
    """The exact options mpirun gets: login works; a changed pinned key makes ssh refuse."""
    layout, port = running_sshd
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env(HOME=str(home))
    ok = subprocess.run(
        ["ssh", *ssh_client_args(layout, port), "127.0.0.1", "echo", "in"], env=env, capture_output=True, text=True
    )
    assert ok.returncode == 0 and ok.stdout.strip() == "in", ok.stderr
    rogue = tmp_path / "rogue"
    keys.generate(rogue)
    layout.known_hosts.write_text(keys.known_hosts_line((rogue / "ssh_host_ed25519_key.pub").read_text()))
    bad = subprocess.run(
        ["ssh", *ssh_client_args(layout, port), "127.0.0.1", "true"], env=env, capture_output=True, text=True
    )
    assert bad.returncode == 255 and "Host key verification failed" in bad.stderr, bad.stderr
    assert not (home / ".ssh" / "known_hosts").exists()  # nothing learnt or written behind our back


@needs_sshd
def command_of(proc: Any) -> str:
    """A process's command line; "" for one that is gone or a zombie (sshd's session helpers come and go)."""
    import psutil

    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def session_processes(daemon: Any, word: str, timeout: float = 10) -> list[Any]:
    """The processes under sshd whose command line holds ``word``, once the ssh session has started one."""
    deadline = time.monotonic() + timeout
    while True:
        found = [p for p in daemon.children(recursive=True) if word in command_of(p)]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_stop_ends_sessions_too(running_sshd: tuple[NodeFiles, int]) -> None:
    layout, port = running_sshd
    session = subprocess.Popen(
        ["ssh", *ssh_client_args(layout, port), "127.0.0.1", "sleep", "300"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import psutil

        daemon = psutil.Process(int(layout.sshd_pid.read_text()))
        sleepers = session_processes(daemon, "sleep")
        assert sleepers
        assert sshd.stop(layout)
        psutil.wait_procs(sleepers, timeout=5)
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in sleepers)
        layout.sshd_pid.write_text(str(daemon.pid))  # the fixture's stop() must find nothing left
        assert not sshd.stop(layout)
        sshd.start(layout, port, ["127.0.0.1"])
    finally:
        session.kill()
        session.wait()


# ----------------------------------------------------------------------------------------
# Hosts and hostfile
# ----------------------------------------------------------------------------------------


def test_hostfile_and_volcano_hosts(tmp_path: Path) -> None:
    text = hosts.render_hostfile("demo", ["10.0.0.1", "10.0.0.2"], 8)
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        "10.0.0.1 slots=8",
        "10.0.0.2 slots=8",
    ]
    (tmp_path / "mpi_worker.host").write_text("a.j\n\n# comment\nb.j\n")
    assert hosts.volcano_hosts("mpi-worker", tmp_path) == ["a.j", "b.j"]
    assert hosts.volcano_hosts("absent", tmp_path) == []


# ----------------------------------------------------------------------------------------
# A peer node's process (node 0's exit code reaches it through the control plane:
# tests/test_control_plane.py, and on netns hosts tests/test_mpi_hosts.py)
# ----------------------------------------------------------------------------------------


def test_peer_holds_the_node_until_stopped_then_stops_sshd_and_its_sessions(
    running_sshd: tuple[NodeFiles, int],
) -> None:
    import psutil

    layout, port = running_sshd
    session = subprocess.Popen(
        ["ssh", *ssh_client_args(layout, port), "127.0.0.1", "sleep", "300"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    peer = subprocess.Popen(
        [sys.executable, "-m", "bootstrap.peer", "--node0", "h0", "--runtime-dir", str(layout.dir)],
        env=clean_env(),
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert peer.stderr is not None
        assert "holding this node for h0's mpirun" in peer.stderr.readline()
        daemon = psutil.Process(int(layout.sshd_pid.read_text()))
        sleepers = session_processes(daemon, "sleep")
        assert sleepers and peer.poll() is None  # it holds the node: nothing ends on its own
        peer.send_signal(signal.SIGTERM)
        assert peer.wait(timeout=10) == 128 + signal.SIGTERM
        psutil.wait_procs([daemon, *sleepers], timeout=5)
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in [daemon, *sleepers])
        assert not layout.sshd_pid.exists()
        sshd.start(layout, port, ["127.0.0.1"])  # the fixture's stop() wants one
    finally:
        peer.kill()
        peer.wait()
        session.kill()
        session.wait()


# ----------------------------------------------------------------------------------------
# Node 0's wrapper: what mpirun is started with
# ----------------------------------------------------------------------------------------


def test_mpirun_env_keeps_exports_and_basics_only() -> None:
    from bootstrap import head

    command = ["mpirun", "-np", "2", "-x", "PATH", "-x", "NCCL_DEBUG", "-x", "FOO=1", "-x", "GONE", "python", "a.py"]
    environ = {
        "PATH": "/bin",
        "NCCL_DEBUG": "INFO",
        "HOME": "/root",
        "LC_ALL": "C",
        "OMPI_MCA_btl": "tcp,self",
        "MLAUNCH_RUN_ID": "r",
        "MLAUNCH_RESTART_COUNT": "1",
        "MLAUNCH_SSH_KEYS": "/keys",
        "MLAUNCH_API_TOKEN": "t",
        "AWS_SECRET_ACCESS_KEY": "s",
        "SOMETHING_ELSE": "x",
    }
    assert head.exported_names(command) == ["PATH", "NCCL_DEBUG", "FOO", "GONE"]
    command = head.with_prefixed_exports(command, environ, ["MLAUNCH_"])
    assert command[3:7] == ["-x", "MLAUNCH_RESTART_COUNT", "-x", "PATH"]  # runner-added, before the program
    command = head.drop_unset_exports(command, environ)
    assert "GONE" not in command and "FOO=1" in command and command[-2:] == ["python", "a.py"]
    env = head.mpirun_env(environ, command, [])
    assert set(env) == {
        "PATH",
        "NCCL_DEBUG",
        "HOME",
        "LC_ALL",
        "OMPI_MCA_btl",
        "MLAUNCH_RUN_ID",
        "MLAUNCH_RESTART_COUNT",
    }
