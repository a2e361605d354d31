"""Who is in the job, who waits to join, when it changes: node 0's hub decides, and says what to do (``effects``).

Node indexes are the platform's (``VC_TASK_INDEX``, ``--rank``...): node 0 hosts the hub and the
rendezvous master and never leaves (without it there is no job to re-form). With an elastic
range ``(MIN, MAX)`` (``pytorch.nnodes: "MIN:MAX"``), instead of ending the job:

- a member that goes silent past ``node_timeout`` (or, just after a peer's TCP connection closed,
  past a few heartbeats: a killed mlaunch is found in about a second), whose mlaunch ended with
  a non-zero code (``bye``), or whose mlaunch started again (a new incarnation says ``hello``)
  is **left out** while at least MIN remain: ``left`` is broadcast, every exchange in flight
  is void (a step staged by only some of the old members must never be committed) and
  contributions of the old membership are refused from then on (``epoch``);
- a node that says ``hello`` and is not a member (it came back, or is new) is a **candidate**:
  it runs no ranks and is admitted, up to MAX, at the next **meeting** (``meet``: every member
  before each generation), whose result tells every member (and the admitted) the membership,
  who left and who joined since the last meeting, and the job's restart count;
- node 0 may ask every member to stop and re-form at once (``regroup``: a candidate waits and a
  checkpoint was just committed);
- a member whose mlaunch ended with code 0 finished the job's training (its ranks exited 0 on
  their own: every rank of a data-parallel job takes the last step together); a meeting that
  would wait for it ends the job with code 0 on every node instead (torch's rendezvous closes the
  same way once an agent succeeds). A storm found the race: node 0 asked to regroup for a
  waiting node as the job's last step ended, and waited for a member that had already finished;
- a member whose mlaunch got SIGTERM (a preemption) says it is **leaving** at once: it is left out
  *gracefully* — its ranks are writing the job's dying checkpoint with everyone else's, so the
  others stop theirs gracefully too, nobody waits for it at the next meeting, and that checkpoint
  is the step the re-formed job resumes from. Waiting candidates count towards MIN: the job
  re-forms with them. When fewer than MIN would remain even so, the hub ends the job on every
  node at once (exit 143, saying why) instead of letting the others wait for a node that is gone.

Below MIN, node 0 lost, or without a range: the loss ends the job (``lost``), as before.

Epochs: ``epoch`` is bumped by every change and every meeting, and agents learn it only from a
meeting's result (``met``), so a contribution made between a departure and the next meeting is
void by design: the exchange it belongs to was made by a membership that no longer exists.

Each decision below changes only the ``Roster`` (through its named transitions) and this
object's bookkeeping, and returns the ``effects`` the hub applies, in order. No socket here.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from launchers.config.elastic import LAST_CALL
from launchers.control import messages as m
from launchers.control.cadence import after_close
from launchers.control.effects import Broadcast, Drop, Effect, EndJob, Multicast, Send, VoidExchanges
from launchers.control.roster import NodeStatus, Roster
from launchers.control.succession import may_go_on

KEEP_MEETINGS = 64  # meeting results kept for a node that says its part again (a rejoin)
LEAVING_CODE = 143  # the job's exit code when a node leaving ends it (128 + SIGTERM)


class Membership:
    def __init__(
        self,
        roster: Roster,
        span: tuple[int, int] | None,
        node_timeout: float,
        last_call: float = LAST_CALL,
        host_node: int = 0,
    ) -> None:
        """``host_node``: the node whose mlaunch runs this hub (node 0, or its successor: ``succession``)."""
        self.roster = roster
        self.host_node = host_node
        self.movable = False  # the hub can move (every node's host is known): its own node may leave gracefully
        self.last_met: frozenset[int] = frozenset(roster.members)  # the last meeting's membership (``may_go_on``)
        self.graceful: set[int] = set()  # members that left gracefully since the last meeting
        self.last_call = last_call
        self.quorum_since: dict[str, float] = {}  # meeting → since when only never-heard members are missing
        self.span = span  # (MIN, MAX); None: the membership never changes (a loss ends the job)
        self.node_timeout = node_timeout
        self.incarnations: dict[int, str] = {}
        self.epoch = 0  # bumped by every change and every meeting: a contribution of an older one is void
        self.departed: list[m.Departure] = []  # since the last meeting
        self.meetings: dict[str, dict[int, m.Meet]] = {}
        self.results: OrderedDict[str, m.Met] = OrderedDict()
        self.regroup_asked = ""
        self.unexplained: list[float] = []  # when connections closed that no departure explains (the socket monitor)
        self.closing: dict[int, float] = {}  # node → until when its mlaunch's connection is expected to close
        self.finished: set[int] = set()  # elastic: members whose mlaunch ended with code 0 (training complete)

    @property
    def elastic(self) -> bool:
        return self.span is not None

    # -- joining ----------------------------------------------------------------------------------
    def restarted(self, hello: m.Hello, now: float) -> list[Effect]:
        """A hello from a member whose incarnation changed: its old mlaunch ended, the old self leaves."""
        if self.span is None:
            return []
        node, known = hello.node, self.incarnations.get(hello.node)
        self.incarnations[node] = hello.incarnation
        if known is None or known == hello.incarnation or node == self.host_node:
            return []
        if self.roster.of(node) is not NodeStatus.MEMBER:
            return []
        self.expect_close(node, now)  # the old mlaunch's connection: closed already, or about to
        return self.depart(node, "its mlaunch started again (the one before it ended)", now) or []

    def on_hello(self, hello: m.Hello, welcome: m.Welcome) -> list[Effect]:
        """``welcome`` to the node: a node that said bye is a member again; one that is not a member waits."""
        node, roster = hello.node, self.roster
        if roster.of(node) is NodeStatus.SAID_BYE:
            roster.rejoin(node)
            self.finished.discard(node)
        if self.span is not None and roster.of(node) in (None, NodeStatus.LEFT_OUT):
            roster.wait(node)
        if roster.of(node) is NodeStatus.CANDIDATE and self.span is not None:
            welcome = replace(welcome, candidate=True, in_job=len(roster.members), max_nodes=self.span[1])
        return [Send(welcome, node)]

    def on_ready(self, node: int) -> list[Effect]:
        """A candidate's standbys are warm: node 0's grow may re-form for it now (``HubView.ready``)."""
        self.roster.mark_ready(node)
        return []

    # -- leaving ----------------------------------------------------------------------------------
    def expect_close(self, node: int, now: float) -> None:
        """``node``'s mlaunch said bye, is leaving, was left out or restarted: its connection closes, saying nothing.

        The socket monitor does not say whose connection closed. A close that a departure explains must
        not put the other members on the short fuse of ``silence_limit``: a storm lost a member 1.6 s
        into node 0's own 1.1 s link flap because a left-out node's mlaunch had just closed its
        connection. When an unexplained close came after the node's last message, that close was
        likely its own (killed, or replaced by a new mlaunch): it is explained now, and nothing more
        is expected of it. CI found the second case: a restarted mlaunch's old connection closed just
        before its new hello, and that close, left unexplained, judged a member whose heartbeats were
        late on a loaded machine after 1.5 s instead of ``node_timeout``.
        """
        heard = self.roster.seen.get(node, -1e9)
        own = next((close for close in self.unexplained if close >= heard), None)  # in time order: the earliest
        if own is not None:
            self.unexplained.remove(own)
            return
        self.closing[node] = now + max(30.0, 10 * self.node_timeout)  # its FIN waits for a link back up

    def on_close(self, now: float) -> None:
        """A peer's TCP connection closed: explained by an expected one, or nodes silent since are judged sooner."""
        self.closing = {node: until for node, until in self.closing.items() if until >= now}
        if self.closing:
            del self.closing[min(self.closing, key=self.closing.__getitem__)]
            return
        self.unexplained = [close for close in self.unexplained if now - close <= self.node_timeout] + [now]

    def _last_unexplained_close(self, now: float) -> float:
        return max((close for close in self.unexplained if now - close <= self.node_timeout), default=-1e9)

    def fuse(self, now: float, heartbeat: float) -> tuple[float, float]:
        """(the last close no departure explains, within ``node_timeout``; the silence that judges a node
        last heard before it): a killed mlaunch is found in a few heartbeats. Said once per look at every node."""
        if self.span is None:
            return -1e9, self.node_timeout
        return self._last_unexplained_close(now), after_close(self.node_timeout, heartbeat)

    def silence_limit(self, now: float, heartbeat: float, heard: float = -1e9) -> float:
        """``node_timeout``; a few heartbeats for a node ``heard`` last before a close no departure explains.

        A node heard after that close is not the one whose connection closed: it keeps ``node_timeout``.
        """
        close, short = self.fuse(now, heartbeat)
        return short if heard < close else self.node_timeout

    def on_silent(self, node: int, seconds: float, now: float) -> list[Effect]:
        """A node silent past the limit: a candidate is dropped, a member left out, or it is lost (the job ends)."""
        roster = self.roster
        why = f"its mlaunch sent nothing for {seconds:.1f}s"
        closed = seconds < self.node_timeout and now - seconds < self._last_unexplained_close(now)
        if closed:  # its mlaunch ended (a partition closes no connection): no voter of the majority
            why += " after a connection to the control plane closed"
        self.expect_close(node, now)  # a cut-off mlaunch gives up on the hub, or learns it is out, and ends
        if roster.of(node) is NodeStatus.CANDIDATE:
            roster.drop(node)
            return [Drop(node)]
        departed = self.depart(node, why, now, seconds, ended=closed)
        if departed is not None:
            return departed
        roster.lose(node)
        return [Broadcast(m.Lost(node, roster.hosts.get(node, ""), seconds, self._cannot_leave(node)))]

    def on_bye(self, node: int, exit_code: int, now: float) -> list[Effect]:
        """A member whose mlaunch ended with a non-zero code leaves an elastic job; else it said bye."""
        roster = self.roster
        self.expect_close(node, now)
        status = roster.of(node)
        if status is NodeStatus.CANDIDATE:  # a candidate that gave up waiting is never admitted
            roster.drop(node)
            return [Drop(node)]
        if self.span is not None and exit_code != 0 and status is NodeStatus.MEMBER:
            departed = self.depart(node, f"its mlaunch ended with exit code {exit_code}", now)
            if departed is not None:
                return departed
        if status is not NodeStatus.MEMBER:
            return []
        roster.said_bye(node)
        if self.span is None or exit_code != 0:
            return []
        self.finished.add(node)
        return [effect for key in list(self.meetings) for effect in self._check_meeting(key)]

    def on_leaving(self, node: int, why: str, now: float) -> list[Effect]:
        """A member's mlaunch was stopped (SIGTERM): left out gracefully; else the job ends on every node.

        Nothing to do without a range, for the hub's own node (its stop moves the hub: ``succession``)
        or a node that is not a member (a candidate's stop is its ``bye``: it is dropped).
        """
        roster = self.roster
        self.expect_close(node, now)
        if node == self.host_node and self.span is not None and self.movable:
            return self._hand_over(node, why)
        if self.span is None or node == self.host_node or roster.of(node) is not NodeStatus.MEMBER:
            if roster.of(node) is NodeStatus.CANDIDATE:
                roster.drop(node)
                return [Drop(node)]
            return []
        departed = self.depart(node, why, now, graceful=True)
        if departed is not None:
            return departed
        said = f"node {node} is leaving ({why}), and the job cannot go on without it: {self._cannot_leave(node)}"
        return [EndJob(m.End(node, LEAVING_CODE, roster.hosts.get(node, ""), f"{said}; every node stops"))]

    def _hand_over(self, node: int, why: str) -> list[Effect]:
        """The hub's own node leaves gracefully: every member is told (``left``, graceful) and moves to the next
        hub (``succession``); its ranks save with theirs. Below MIN the job ends on every node, as for any."""
        assert self.span is not None
        roster = self.roster
        rest = (roster.members - {node}) | set(roster.nodes(NodeStatus.CANDIDATE))
        if not may_go_on(self.last_met, rest, self.span[0], self.graceful | {node}):
            said = f"node {node} is leaving ({why}), and the job cannot go on without it: {self._cannot_leave(node)}"
            return [EndJob(m.End(node, LEAVING_CODE, roster.hosts.get(node, ""), f"{said}; every node stops"))]
        departure = m.Departure(node, roster.hosts.get(node, ""), why, 0.0, True)
        return [Broadcast(m.Left(departure, len(roster.members) - 1))]

    def depart(
        self, node: int, why: str, now: float, seconds: float = 0.0, graceful: bool = False, ended: bool = False
    ) -> list[Effect] | None:
        """Leave ``node`` out (what follows), or None when the job cannot go on without it.

        It cannot when ``node`` hosts this hub (its loss moves the hub instead), below MIN, or when the
        rest would not hold a strict majority of the last meeting's membership (``succession.may_go_on``:
        the other side of a partition may be the one going on). Waiting candidates count towards MIN:
        the next meeting admits them. ``graceful``: its mlaunch said it is leaving (its ranks are saving
        with everyone's), not lost: it is not told it was left out, and its silence is never judged again.
        """
        roster = self.roster
        if self.span is None or node == self.host_node or roster.of(node) is not NodeStatus.MEMBER:
            return None
        if not self._may_go_on_without(node, graceful or ended or not seconds):
            return None
        if graceful or ended or not seconds or node not in roster.seen:
            self.graceful.add(node)  # not a voter of the majority from now on (``succession.may_go_on``)
        roster.leave_out(node)
        self.epoch += 1
        host = roster.hosts.get(node, "")
        departure = m.Departure(node, host, why, round(seconds, 3), graceful)
        self.departed.append(departure)
        told = None if graceful else m.LeftOut(node, host, self.out_reason(why))  # a link that came back stops
        effects: list[Effect] = [Drop(node, told), Broadcast(m.Left(departure, len(roster.members)))]
        effects.append(VoidExchanges(f"node {node} left the job ({why}); an exchange of the old membership is void"))
        for key in list(self.meetings):
            effects += self._check_meeting(key)
        return effects

    def _may_go_on_without(self, node: int, heard: bool) -> bool:  # heard: said, ended, never heard: no voter
        assert self.span is not None
        remaining = (self.roster.members - {node}) | set(self.roster.nodes(NodeStatus.CANDIDATE))
        agreed = heard or node not in self.roster.seen
        return may_go_on(self.last_met, remaining, self.span[0], self.graceful | ({node} if agreed else set()), True)

    def _cannot_leave(self, node: int) -> str:
        if self.span is None:
            return ""
        if node == self.host_node and not self.movable:
            return (
                f"node {node} hosts the control plane, and the platform names no host list to move it to "
                "(VC_WORKER_HOSTS, SLURM_JOB_NODELIST, a rank table, an MPI hostfile ...)"
            )
        left = len(self.roster.members) - 1
        candidates = len(self.roster.nodes(NodeStatus.CANDIDATE))
        waiting = f" and {candidates} waiting to join" if candidates else ""
        if left + candidates < self.span[0]:
            return (
                f"only {left} node(s) would remain{waiting}, below the elastic minimum {self.span[0]} (pytorch.nnodes)"
            )
        voters = len(self.last_met - self.graceful)
        return (
            f"the {left} node(s) that would remain hold no strict majority of the {voters} node(s) of the last "
            "membership: the others may be going on without them (no split brain)"
        )

    @staticmethod
    def out_reason(why: str) -> str:
        return f"this node was left out of the job: {why}; start its mlaunch again to rejoin"

    def current(self, put: m.Put) -> bool:
        """A contribution made under the membership the hub has now (an older one is void)."""
        return self.span is None or put.epoch == self.epoch

    # -- meeting ----------------------------------------------------------------------------------
    def on_meet(self, meet: m.Meet) -> list[Effect]:
        done = self.results.get(meet.key)
        if done is not None:  # said again (its answer was lost on a link that came back): the same answer
            if meet.node in done.members and self.roster.of(meet.node) is NodeStatus.MEMBER:
                return [Send(done, meet.node)]
            return []  # never an old generation's answer to a node that is not in it now (a candidate)
        if meet.node not in self.roster.members:
            return []
        self.meetings.setdefault(meet.key, {})[meet.node] = meet
        return self._check_meeting(meet.key)

    def _check_meeting(self, key: str) -> list[Effect]:
        said, roster = self.meetings.get(key), self.roster
        if said is not None and self.finished:
            return self._finished_while_meeting(key)
        if said is None or len(said) < len(roster.members) or not roster.members <= said.keys():
            return []  # the count first: the subset test is O(N), and a meet comes from each of N nodes
        del self.meetings[key]
        self.quorum_since.pop(key, None)  # a last call under way for it ends with it
        joined: list[int] = []
        if self.span is not None and all(part.admit for part in said.values()):
            joined = roster.nodes(NodeStatus.CANDIDATE)[: max(0, self.span[1] - len(roster.members))]
            for node in joined:
                roster.admit(node)
        self.epoch += 1
        result = m.Met(
            key,
            max(part.generation for part in said.values()),
            tuple(sorted(roster.members)),
            tuple(m.Joined(n, roster.hosts.get(n, "")) for n in joined),
            tuple(self.departed),
            self.epoch,
            max(part.restarts for part in said.values()),
            self.regroup_asked,
        )
        self.departed, self.regroup_asked = [], ""
        self.last_met, self.graceful = frozenset(roster.members), set()
        self.results[key] = result
        while len(self.results) > KEEP_MEETINGS:
            self.results.popitem(last=False)
        return [Multicast(result, result.members)]  # one encoding of an O(N) result, not one per member

    def _finished_while_meeting(self, key: str) -> list[Effect]:
        """A member finished the job's training while the others meet: no meeting can include it; the job is done."""
        self.meetings.pop(key, None)
        self.quorum_since.pop(key, None)
        node = min(self.finished)
        why = (
            f"node {node}'s training finished (its mlaunch ended with exit code 0) while the other nodes met to "
            "re-form; every rank takes the last step together, so the job is complete"
        )
        return [EndJob(m.End(node, 0, self.roster.hosts.get(node, ""), why))]

    def on_tick(self, now: float) -> list[Effect]:
        """The first start's last call: members never heard from are left out once MIN met and ``last_call`` passed.

        Every node index starts as a member, and a meeting waits for every member. A node whose
        mlaunch never reached the hub (its pod did not start, it was killed before its hello) is
        never judged by its silence — it was never heard. Without a range the job waits for it
        (``monitor.join_timeout``); with one, once at least MIN members met and only never-heard
        ones are missing, they get ``last_call`` seconds (torchrun's last call), then the job
        starts without them. A node left out so can still join: it is a candidate, admitted as any.
        """
        if self.span is None or not self.meetings:
            return []
        effects: list[Effect] = []
        for key in list(self.meetings):
            missing = self._never_heard_missing(key)
            if not missing:
                self.quorum_since.pop(key, None)
                continue
            since = self.quorum_since.setdefault(key, now)
            if now - since < self.last_call:
                continue
            del self.quorum_since[key]
            said = len(self.meetings[key])
            why = f"its mlaunch never reached the control plane ({self.last_call:g}s after {said} nodes met: last call)"
            for node in missing:
                effects += self.depart(node, why, now) or []
        return effects

    def _never_heard_missing(self, key: str) -> list[int]:
        """The members missing from meeting ``key`` when all of them were never heard and at least MIN met."""
        said, roster = self.meetings.get(key), self.roster
        assert self.span is not None
        if said is None or len(said) < self.span[0] or len(said) >= len(roster.members):
            return []
        missing = sorted(roster.members - said.keys())
        if any(node in roster.seen or roster.of(node) is not NodeStatus.MEMBER for node in missing):
            return []  # a heard member is judged by its silence (``on_silent``); one that said bye is waited for
        return missing

    def regroup(self, why: str) -> list[Effect]:
        """Node 0 asks every member to stop its ranks gracefully and meet (a candidate is admitted there)."""
        if self.span is None or self.regroup_asked or not self.roster.nodes(NodeStatus.CANDIDATE):
            return []
        self.regroup_asked = why
        return [Broadcast(m.Regroup(self.host_node, why))]
