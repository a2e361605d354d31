"""Machine-loss replication for one elastic mlaunch run (``checkpoint.replicate``): the runner's two hooks.

The runner calls ``begin(plan, attempt)`` when a generation starts (after its members met) and
``end(outcome)`` when it is over. In between this node streams its ranks' newest staged slots
to its ring buddy (``peer_copy``) and holds its predecessor's (``replica_store``). When the
generation was ended by a node leaving, ``end`` copies this node's staged slots out of shared
memory (the runner unlinks the segments right after, and the next generation's ranks reuse
their names), and the next ``begin`` has the survivors commit the newest step the state is
whole for (``survivor_save``) before their ranks start and resume from it. That is done after
any failed generation, not only one a ``left`` ended: a rank often sees its peer's connection
reset before the control plane declares the node gone, and the generation then ends as a
failure whose flash save was void. Without a node lost it commits nothing the flash save did
not (node 0 finds the step already committed) and says nothing.

What it costs, said in the log and in ``events.jsonl`` (``replication``): the bytes a node
holds (its buddy's two slots per rank, the two copies it sent of its own) and the bytes on
the wire per replicated step; ``mlaunch status`` shows each node's newest replicated step.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launchers.control import ExchangeTimedOut, topics
from launchers.log import say
from launchers.outcome import Outcome
from launchers.persist.peer_copy import LAG_WARN, Agree, PeerCopy, is_sharded
from launchers.persist.replica_plan import ROUND_HOW
from launchers.persist.replica_store import ReplicaStore
from launchers.persist.slot_copy import Torn, open_ranks
from launchers.persist.survivor_save import Captured, Exchange, start_generation
from launchers.persist.survivor_save import Outcome as SaveOutcome

if TYPE_CHECKING:
    from launchers.plan import LaunchPlan

Record = Callable[..., Any]  # events.jsonl: (event name, **fields)


def for_run(mode: str, run_id: str, events: Any, record: Record, elastic: bool) -> Replication | None:
    """The run's replication: an elastic job across real nodes (one mlaunch each) unless ``replicate: off``."""
    if mode == "off" or not elastic or not events.networked:
        return None
    return Replication(run_id, mode, events.node, events.secret, record)


def own_address(master_addr: str, port: int) -> str:
    """This node's address as its peers reach it: the source address of the route to node 0."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((master_addr, port or 9))
        return str(probe.getsockname()[0])
    return socket.gethostbyname(socket.gethostname())


ROUND_WAIT = 60.0  # a round waits this long for the slowest stream's node (then the next round is tried)
ROUND_SLICE = 2.0  # ... asking again this often (each ask is a message to the hub), so a stopped stream lets go soon


def rounds(exchange: Exchange, attempt: int) -> Agree:
    """The streams' rounds of ``attempt`` agreed through the control plane (``replica_plan.round_of``).

    A round waits for the slowest stream's node, up to ``ROUND_WAIT``. It asks in slices so that a
    stream stopped at the end of its generation (the others may never contribute) ends within a slice:
    a blocked thread would keep the old attempt's shared memory mapped.
    """

    def agree(number: int, offer: Mapping[str, Any], stop: threading.Event) -> Mapping[str, Any]:
        topic = topics.replica_round(attempt, number)
        end = time.monotonic() + ROUND_WAIT
        while True:
            try:
                return dict(exchange(topic, dict(offer), min(end, time.monotonic() + ROUND_SLICE), ROUND_HOW))
            except ExchangeTimedOut:
                if stop.is_set() or time.monotonic() >= end:
                    raise

    return agree


class Replication:
    """Replication across the attempts of one run; ``mode`` is job.yaml's ``checkpoint.replicate``."""

    def __init__(self, run_id: str, mode: str, node: int, secret: bytes, record: Record) -> None:
        self.run_id, self.mode, self.node, self.secret = run_id, mode, node, secret
        self.record = record  # events.jsonl
        self.on_commit: Callable[[int, str], None] | None = None
        self.store = ReplicaStore(secret)
        self.sender: PeerCopy | None = None
        self.captured: Captured | None = None
        self.local: dict[int, int] = {}  # this attempt's rank → local rank
        self.attempt = 0
        self._said: set[str] = set()

    # -- the runner's hooks -------------------------------------------------------------------------
    def begin(self, plan: LaunchPlan, attempt: int, exchange: Exchange) -> None:
        """A generation starts: the survivors' commit after a loss, then the ring of this membership."""
        self.attempt = attempt
        new_local = {
            p.local_rank: p.rank for n in plan.nodes for p in n.processes if p.role == "worker" and p.rank >= 0
        }
        captured, self.captured = self.captured, None
        renumber = {r: new_local[lr] for r, lr in (captured.local if captured else {}).items() if lr in new_local}
        addr = f"{own_address(plan.master_addr, plan.control_port)}:{self.store.port}"
        try:
            buddy, saved = start_generation(
                self.node, addr, captured, renumber, attempt, exchange, self._held(captured)
            )
        except RuntimeError as exc:  # the control plane's ExchangeFailed: a node lost meanwhile
            say(f"replication: the members could not agree before generation {attempt}: {exc}")
            buddy, saved = "", None
        if saved is not None:
            self._report(saved, captured)
        self.store.drop_before(attempt)
        self.local = {r: lr for lr, r in new_local.items()}
        if buddy and self.local:
            host, _, port = buddy.rpartition(":")
            ranks = set(self.local)
            agree = rounds(exchange, attempt)
            address = (host, int(port))
            self.sender = PeerCopy(self.run_id, attempt, self.node, ranks, address, self.secret, self.mode, agree)
            self.sender.start()

    def end(self, outcome: Outcome) -> None:
        """A generation is over: stop streaming; after a node left, keep this node's staged slots for ``begin``."""
        sender, self.sender = self.sender, None
        if sender is not None:
            sender.stop()
            self._figures(sender)
        self.tick()
        if outcome.failure is not None or outcome.status == "reformed":  # a node left, or a rank saw it go first
            self.captured = self._capture(sender)

    def tick(self) -> None:
        """Say what the threads had to say (they never print: the supervisor may fork meanwhile)."""
        for source in (self.store.messages, self.sender.messages if self.sender else None):
            while source is not None:
                try:
                    message = source.get_nowait()
                except queue.Empty:
                    break
                if message not in self._said:
                    self._said.add(message)
                    say(message)

    def status(self) -> dict[str, Any]:
        """This node's entry in ``mlaunch status``: the newest step streamed and the newest step held."""
        sender = self.sender
        held = self.store.newest()
        replicated = sender is not None and sender.sharded is False and self.mode == "auto"
        return {
            "replica": "replicated state" if replicated else "buddy" if sender is not None else "none",
            "replicated_step": sender.stats.last_sent if sender is not None and sender.stats.last_sent >= 0 else None,
            "replica_behind": sender.stats.behind if sender is not None else None,
            "replica_at_risk": sender is not None and sender.stats.behind > LAG_WARN,
            "holds_step": max(held.values()) if held else None,
            "replica_bytes": self.store.bytes_held(),
            "replica_refused": self.store.refused,  # slots whose keyed digest did not match: never stored
        }

    def close(self) -> None:
        if self.sender is not None:
            self.sender.stop()
        self.store.close()

    # -- inside -------------------------------------------------------------------------------------
    def _held(self, captured: Captured | None) -> Callable[[int, int], bytearray | None]:
        old = captured.attempt if captured is not None else self.attempt - 1

        def image(rank: int, step: int) -> bytearray | None:
            return self.store.image(old, rank, step)

        return image

    def _capture(self, sender: PeerCopy | None) -> Captured | None:
        """This node's ranks' complete staged slots of the attempt (its ranks are stopped), and the copies it sent."""
        segments = open_ranks(self.run_id, set(self.local), {})
        images: dict[int, dict[int, bytearray]] = {r: {} for r in self.local}
        root, world, keep, newest = "", 0, 3, -1
        try:
            for rank, seg in segments.items():
                head = seg.header()
                if head is None:
                    continue
                root, world, keep = head.ckpt_dir, head.world, max(head.keep, 1)
                for step, slot in head.complete(self.attempt).items():
                    with contextlib.suppress(Torn, OSError):
                        images[rank][step] = seg.copy(head, slot)
                        newest = max(newest, step)
        finally:
            for seg in segments.values():
                seg.close()
        if sender is not None:
            for rank, kept in sender.retained_images().items():
                for step, image in kept.items():
                    images.setdefault(rank, {}).setdefault(step, image)
        if not root or not any(images.values()):
            return None
        sharded = any(is_sharded(i) for steps in images.values() for i in steps.values())
        held = self.store.holding(self.attempt)
        return Captured(self.attempt, images, dict(self.local), Path(root), world, keep, sharded, newest, held)

    def _figures(self, sender: PeerCopy) -> None:
        stats = sender.stats
        if not stats.sent_steps:
            return
        held = self.store.bytes_held() + sender.bytes_held()
        say(
            f"replication: {stats.sent_steps} step(s) streamed to {sender.buddy[0]} ({stats.slot_bytes / 1e6:.1f} MB "
            f"on the wire per step), {stats.skipped_steps} skipped while the link was busy; "
            f"{held / 1e6:.1f} MB of slots held in this mlaunch; a copy arrived at most {stats.most_behind} step(s) "
            "behind the newest staged"
        )
        self.record(
            "replication",
            attempt=sender.attempt,
            steps_sent=stats.sent_steps,
            steps_skipped=stats.skipped_steps,
            most_behind=stats.most_behind,
            bytes_per_step=stats.slot_bytes,
            bytes_sent=stats.sent_bytes,
            busy_s=round(stats.busy_seconds, 3),
            bytes_held=held,
        )

    def _report(self, saved: SaveOutcome, captured: Captured | None) -> None:
        """Say which step the loss cost and why, on every node; events.jsonl and status learn the commit."""
        v = saved.verdict
        if saved.committed and v.step is not None and self.on_commit is not None:
            self.on_commit(v.step, "replica")
        if not v.lost:  # a restart without a node lost: the flash save's work, said only if this did it
            if saved.committed:
                say(f"committed step {v.step} from the ranks' staged state before the restart")
            return
        ranks = ", ".join(map(str, v.lost[:8])) + ("…" if len(v.lost) > 8 else "")
        before = f"step {v.committed}" if v.committed is not None else "no checkpoint (a fresh start)"
        if v.step is not None and saved.committed:
            source = "buddy copies of the lost rank(s)" if v.how == "buddy" else "the survivors' own ranks"
            said = (
                f"node loss (rank(s) {ranks}): committed step {v.step} from {source}: {v.reason}; the newest "
                f"step staged was {v.newest}: {v.lost_steps} step(s) lost beyond it "
                f"({saved.nbytes / 1e6:.1f} MB written here in {saved.seconds:.2f}s)"
            )
        elif v.step is not None:
            said = f"node loss (rank(s) {ranks}): step {v.step} could not be committed; resuming from {before}"
        else:
            said = f"node loss (rank(s) {ranks}): resuming from the last commit, {before}: {v.reason}"
        say(said)
        self.record(
            "node_loss",
            how=v.how if saved.committed or v.step is None else "failed",
            step=v.step if saved.committed else None,
            lost_ranks=list(v.lost),
            newest_staged=v.newest,
            steps_lost=v.lost_steps if saved.committed else None,
            fallback_step=None if saved.committed else v.committed,
            reason=v.reason,
            seconds=round(saved.seconds, 3),
        )
