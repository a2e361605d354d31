"""The completion channel: node 0 tells every other node how the job ended.

The seed's script kept the other nodes alive with ``sleep 365d`` and ended them with a
second mpirun running ``pkill sleep``; their exit code never said anything, and if node 0
vanished they slept for a year. Here each peer node runs a small listener (``bootstrap.peer``)
and node 0's wrapper (``bootstrap.head``) keeps one TCP connection to each:

    peer → node 0   ``mlaunch-completion/1 <nonce>``           (a fresh random challenge)
    node 0 → peer   ``hello <seq> - <mac>``                    node 0 is alive
    node 0 → peer   ``beat <seq> - <mac>``                     every heartbeat interval
    node 0 → peer   ``exit <seq> <code> <mac>``                the job's exit code
    peer → node 0   ``ok`` | ``bad``                           after hello and exit

``mac`` is HMAC-SHA256 over ``nonce|job|attempt|seq|kind|value`` with a key derived from the
job's private key (``bootstrap.keys.completion_secret``): a stray connection, another job,
an earlier attempt or a replayed message cannot end a node. Sequence numbers must grow.

A peer exits with the code node 0 sends. If node 0 never connects within the first-contact
deadline, or falls silent (no heartbeat, connection gone) for ``node0_timeout`` seconds,
the peer exits non-zero on its own instead of hanging forever.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

MAGIC = "mlaunch-completion/1"
LINE_LIMIT = 512
EXIT_NODE0_LOST = 1  # a peer's exit code when node 0 never said how the job ended


def heartbeat_interval(node0_timeout: float) -> float:
    """Beats often enough that a peer tolerates a few lost ones before declaring node 0 gone."""
    return max(0.2, min(5.0, node0_timeout / 5))


def mac(secret: bytes, nonce: str, job: str, attempt: int, seq: int, kind: str, value: str) -> str:
    message = f"{nonce}|{job}|{attempt}|{seq}|{kind}|{value}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


class LineSocket:
    """Newline-framed text over a socket, with a per-read timeout and a line-length limit."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = b""

    def send(self, line: str) -> None:
        self.sock.sendall(line.encode() + b"\n")

    def recv(self, timeout: float) -> str | None:
        """The next line, or None when the peer closed; raises TimeoutError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no line in time")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1024)
            except TimeoutError:
                raise TimeoutError("no line in time") from None
            if not data:
                return None
            self._buf += data
            if len(self._buf) > LINE_LIMIT:
                raise ValueError("line too long")
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("ascii", "replace").strip()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


# ----------------------------------------------------------------------------------------
# Node 0: the notifier
# ----------------------------------------------------------------------------------------


@dataclass
class PeerLink:
    host: str
    connected: bool = False
    delivered: bool = False
    rejected: bool = False
    last_error: str = ""


@dataclass
class Notifier:
    """Node 0's side: keep a link to every peer, beat, and finally send the exit code."""

    peers: Sequence[str]
    port: int
    secret: bytes
    job: str
    attempt: int
    heartbeat: float
    log: Callable[[str], None] = lambda message: None
    links: dict[str, PeerLink] = field(default_factory=dict)
    _code: int | None = None
    _finish: threading.Event = field(default_factory=threading.Event)
    _give_up_at: float = float("inf")
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Notifier:
        for host in dict.fromkeys(self.peers):
            self.links[host] = PeerLink(host)
            thread = threading.Thread(target=self._run, args=(self.links[host],), daemon=True, name=f"notify-{host}")
            thread.start()
            self._threads.append(thread)
        return self

    def finish(self, code: int, timeout: float) -> dict[str, PeerLink]:
        """Send ``code`` to every peer (retrying until ``timeout``); return each link's state."""
        self._code = code
        self._give_up_at = time.monotonic() + timeout
        self._finish.set()
        for thread in self._threads:
            thread.join(max(0.0, self._give_up_at - time.monotonic()) + 0.5)
        return self.links

    def _run(self, link: PeerLink) -> None:
        seq = 0
        while not link.delivered and time.monotonic() < self._give_up_at:
            try:
                sock = socket.create_connection((link.host, self.port), timeout=2.0)
            except OSError as exc:
                link.last_error = f"connect: {exc.strerror or exc}"
                self._finish.wait(0.25)
                continue
            chan = LineSocket(sock)
            try:
                seq = self._session(link, chan, seq)
            except (OSError, TimeoutError, ValueError) as exc:
                link.last_error = str(exc) or type(exc).__name__
            finally:
                link.connected = False
                chan.close()
            if not link.delivered:
                self._finish.wait(0.25)

    def _session(self, link: PeerLink, chan: LineSocket, seq: int) -> int:
        banner = chan.recv(5.0)
        if banner is None or not banner.startswith(MAGIC + " "):
            raise ValueError(f"unexpected greeting {banner!r}")
        nonce = banner.split(" ", 1)[1]

        def send(kind: str, value: str) -> None:
            nonlocal seq
            seq += 1
            chan.send(f"{kind} {seq} {value} {mac(self.secret, nonce, self.job, self.attempt, seq, kind, value)}")

        send("hello", "-")
        answer = chan.recv(5.0)
        if answer != "ok":
            link.rejected = True
            raise ValueError(f"peer refused our hello ({answer!r}): another job or attempt is listening there")
        link.connected, link.rejected = True, False
        while not self._finish.wait(self.heartbeat):
            send("beat", "-")
        send("exit", str(self._code))
        if chan.recv(max(1.0, self._give_up_at - time.monotonic())) == "ok":
            link.delivered = True
        return seq


# ----------------------------------------------------------------------------------------
# Peer nodes: the listener
# ----------------------------------------------------------------------------------------


class Listener:
    """A peer's side: accept node 0's links, verify every message, remember the exit code."""

    def __init__(self, sock: socket.socket, secret: bytes, job: str, attempt: int) -> None:
        self.sock = sock
        self.secret = secret
        self.job = job
        self.attempt = attempt
        self.code: int | None = None
        self.last_contact: float | None = None
        self.links = 0  # authenticated links open now
        self.rejected = 0  # connections that failed authentication
        self._lock = threading.Lock()
        self.done = threading.Event()

    def serve(self, until: Callable[[], bool]) -> None:
        """Accept connections until ``until()`` says stop or an exit code arrived."""
        self.sock.settimeout(0.2)
        while not self.done.is_set() and not until():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _touch(self) -> None:
        with self._lock:
            self.last_contact = time.monotonic()

    def _handle(self, conn: socket.socket) -> None:
        chan = LineSocket(conn)
        nonce = secrets.token_hex(16)
        last_seq = 0
        authenticated = False
        try:
            chan.send(f"{MAGIC} {nonce}")
            while not self.done.is_set():
                # Before hello a connection gets a few seconds; after it, silence means node 0 is gone.
                line = chan.recv(10.0 if not authenticated else 3600.0)
                if line is None:
                    return
                parts = line.split(" ")
                if len(parts) != 4 or not (parts[1].isascii() and parts[1].isdigit()):
                    raise ValueError("malformed message")
                kind, seq_text, value, their_mac = parts
                seq = int(seq_text)
                good = hmac.compare_digest(mac(self.secret, nonce, self.job, self.attempt, seq, kind, value), their_mac)
                if not good or seq <= last_seq or kind not in ("hello", "beat", "exit"):
                    with self._lock:
                        self.rejected += 1
                    chan.send("bad")
                    return
                if not authenticated and kind != "hello":
                    raise ValueError("message before hello")
                last_seq = seq
                self._touch()
                if kind == "hello":
                    authenticated = True
                    with self._lock:
                        self.links += 1
                    chan.send("ok")
                elif kind == "exit":
                    code = int(value) if value.isascii() and value.lstrip("-").isdigit() else EXIT_NODE0_LOST
                    with self._lock:
                        if self.code is None:
                            self.code = code & 0xFF if code >= 0 else EXIT_NODE0_LOST
                    chan.send("ok")
                    self.done.set()
                    return
        except (OSError, TimeoutError, ValueError):
            return
        finally:
            if authenticated:
                with self._lock:
                    self.links -= 1
            chan.close()


def bind_listener(addresses: Sequence[str], port: int) -> socket.socket:
    """A listening socket on the first of ``addresses`` that binds (``0.0.0.0`` as the last resort)."""
    last: OSError | None = None
    for address in [*addresses, "0.0.0.0"]:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            last = exc
            sock.close()
            continue
        sock.listen(64)
        return sock
    assert last is not None
    raise last
