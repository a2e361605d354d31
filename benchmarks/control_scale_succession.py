"""``control_scale``'s hub-loss phase (issue 45 item 5): node 0's process SIGKILLed, the hub moves to node 1.

After the other phases, the conductor kills node 0's process (a machine lost: nothing said, its
sockets closed by the kernel). Every surviving agent finds the hub silent after its connection
closed (``cadence.after_close``; ``node_timeout`` without a close), computes the successor from the
membership it holds (``succession``: node 1) and reconnects there; node 1's mlaunch — the real
``NetworkEvents`` with its own driver, in a process of its own as on its machine — starts the new
hub (``successor_hub``). Each agent then says its part of the next meeting at once (a supervisor
meets once its ranks stopped: none here), as the product does after a ``Left``. Per agent, every
process stamps (``CLOCK_MONOTONIC``, one clock for all processes on the machine):

- **detected**: the agent moved (``AgentState._move``: its wake-up, in the driver's thread);
- **welcomed**: the successor's hub answered its ``hello`` (looked for every ``EVERY`` seconds);
- **met**: the meeting's answer arrived (its wake-up).

Reported from the kill (total) and from the first detection (what the move itself costs).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

EVERY = 0.01  # seconds between looks for the agents' welcomes (that stamp's resolution)
KEY = "hub-loss"  # the meeting after the move
GOAL_S = 1.0  # every agent at the new hub and the next meeting done (issue 45 item 5)


def span(nnodes: int) -> tuple[int, int]:
    """The job's node range: elastic, so the hub may move (MIN below the survivors)."""
    return (max(1, nnodes // 2), nnodes)


def hosts(nnodes: int, node0: str) -> tuple[str, ...]:
    """Every node's host (the platform's list): node 0's machine, then the others' (``control_scale_hosts``)."""
    return (node0, *("127.0.0.1",) * (nnodes - 1))


def arm(agents: list[Any], stamps: dict[int, list[float]]) -> None:
    """Each agent's wake-up (the driver's thread): its move stamped, and its part of the meeting said at once;
    the meeting's answer stamped (``on_met`` wakes it too), with its welcome if ``watch`` had not seen it yet."""

    def woke(events: Any) -> None:
        state, got, now = events.state, stamps.get(events.node), time.monotonic()
        if got is None and state.tried:
            stamps[events.node] = [now]
            state.meet(KEY, 1, 1, True)
            events.driver.kick(state)
        elif got is not None and len(got) < 3 and KEY in state.meetings:
            got.extend([now] * (3 - len(got)))

    for events in agents:
        events.state.wake = lambda events=events: woke(events)


def watch(agents: list[Any], stamps: dict[int, list[float]], until: tuple[float, float]) -> dict[int, list[float]]:
    """Each agent's (moved, welcomed, met) times, once all are done or after ``until[0]`` s (missing: NaN).

    The welcome is looked for every ``EVERY`` seconds (nothing wakes on it); a light loop, since it
    shares its process's CPU with the driver of 1,024 agents."""
    end = time.monotonic() + until[0]
    left = list(agents)
    while left and time.monotonic() < end:
        now = time.monotonic()
        waiting = []
        for events in left:
            got = stamps.get(events.node)
            if got is not None and len(got) == 1 and not events.state.moving:
                got.append(now)  # the successor's welcome (or the meeting's answer stamped it first)
            if got is None or len(got) < 3:
                waiting.append(events)
        left = waiting
        time.sleep(EVERY)
    nan = float("nan")
    return {e.node: [*stamps.get(e.node, []), nan, nan, nan][:3] for e in agents}


def measure(killed: float, answers: list[dict[int, list[float]]], nnodes: int) -> dict[str, Any]:
    """The figures of the phase from every process's stamps (``watch``) and the moment of the kill."""
    stamps = {node: times for answer in answers for node, times in answer.items()}
    done = [t for t in stamps.values() if t[2] == t[2]]  # NaN: never met
    result: dict[str, Any] = {"loss_survivors": nnodes - 1, "loss_met": len(done)}
    if len(done) < nnodes - 1:
        missing = sorted(n for n, t in stamps.items() if t[2] != t[2])
        moved, welcomed = (sum(1 for t in stamps.values() if t[i] == t[i]) for i in (0, 1))  # not NaN
        print(f"  warning: {nnodes - 1 - len(done)} of {nnodes - 1} survivors never met at the new hub "
              f"({moved} moved, {welcomed} welcomed there): {missing[:10]}", flush=True)  # fmt: skip
        return {**result, **dict.fromkeys(("detect_max", "welcome_max", "met_max", "move_s", "move_met_s"), 0.0)}
    detected, welcomed_at, met = ([t[i] for t in done] for i in range(3))
    first = min(detected)
    result.update(
        detect_first=first - killed,
        detect_max=max(detected) - killed,
        welcome_median=statistics.median(welcomed_at) - killed,
        welcome_max=max(welcomed_at) - killed,
        met_max=max(met) - killed,
        move_s=max(welcomed_at) - first,  # from the first agent's detection to the last one welcomed
        move_met_s=max(met) - first,
        own_median=statistics.median(w - d for d, w, _ in done),  # each agent: its detection → its welcome
        own_max=max(w - d for d, w, _ in done),
        successor_up=stamps[1][0] - killed,  # node 1 moved: its hub started then
    )
    return result


def report(nnodes: int, r: dict[str, Any]) -> None:
    """The phase's lines (the verdict's)."""
    curve = "CURVE" if r.get("curve", True) else "no CURVE"
    met = f"{r['loss_met']} of {r['loss_survivors']} survivors met at node 1's hub"
    print(f"  node 0 lost at N={nnodes} ({curve}): {met}")
    if r["loss_met"] < r["loss_survivors"]:
        return
    print(
        f"    from the kill: detected {r['detect_first']:.2f}–{r['detect_max']:.2f} s (the hub's silence after its "
        f"connection closed), node 1's hub started {r['successor_up']:.2f} s; welcomed median "
        f"{r['welcome_median']:.2f} s, max {r['welcome_max']:.2f} s; meeting done {r['met_max']:.2f} s"
    )
    print(
        f"    after detection: every agent welcomed {r['move_s']:.3f} s, meeting done {r['move_met_s']:.3f} s "
        f"(goal ≤ {GOAL_S:g} s) {'met' if r['move_met_s'] <= GOAL_S else 'NOT met'}; each agent's own "
        f"detection → welcome: median {r['own_median'] * 1e3:.0f} ms, max {r['own_max'] * 1e3:.0f} ms"
    )
    print(
        f"    handshakes at the new hub (CURVE's, when on): {r['loss_handshakes']}; node 1's process (its agent and "
        f"the new hub) used {r['successor_cpu']:.2f} s of CPU from the kill until every survivor met; each other agent "
        f"{r['agents_cpu'] * 1e3:.1f} ms (its move, handshake, hello and meeting; on a real node its own core's)"
    )
