"""The control plane's protocol is defined once (``launchers/control/messages.py``): round trips, dispatch, spelling.

- every kind survives ``to_wire`` → JSON → ``decode`` unchanged, and a malformed one raises
  what the receivers drop;
- the hub and the agent dispatch on the one table: each handles exactly the kinds the other
  side says;
- no other module spells a kind or a wire field: inside ``launchers/control/`` no string
  (docstrings aside) equals one, and nowhere in the source tree is the wire's kind field
  (``"t"``) spelled. Outside the plane the kinds are plain English words that other features
  use for their own meanings (an events.jsonl ``left`` record, ``health_check.on_failure:
  fail``), so there the test looks for the wire's own mark instead.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT

from launchers.control import messages as m

SAMPLES: list[m.Message] = [
    m.Hello(3, "h3", "abcd", 2),
    m.Heartbeat(3),
    m.Heartbeat(),
    m.Summary(summary={"phase": "running"}),
    m.Status(3, {"index": 3, "ranks": [{"rank": 7, "step": 9}]}),
    m.Fail(3, 7, "rank 7", 137, 9, "hung: no progress", 2, "h3"),
    m.Fail(3, 7, "rank 7", 1),
    m.Put(3, "cand/k", {"ok": "and", "next": "max"}, {"ok": True, "next": 4}, 5),
    m.Ask(3),
    m.Summary(0, {"phase": "running"}),
    m.End(0, 5, "h0"),
    m.End(2, 143, "h2", "node 2 is leaving"),
    m.Meet(3, "4", 4, 1, False),
    m.Regroup(0, "node 2 waits to join"),
    m.Ready(2),
    m.Leaving(3, "SIGTERM"),
    m.Bye(3, 1),
    m.Welcome(4, 0.5, 1.0, 1.0, True, 2, 4, m.Fail(1, 0, "rank 0", 1), m.End(0, 0), {"phase": "x"}),
    m.Got("start/1", 4),
    m.Got("start/1", error="void"),
    m.Lost(2, "h2", 5.5, "below the minimum"),
    m.LeftOut(2, "h2", "silent"),
    m.Left(m.Departure(2, "h2", "silent", 1.5, True), 3),
    m.Met("4", 4, (0, 1, 2), (m.Joined(2, "h2"),), (m.Departure(3, "h3", "bye"),), 7, 1, "why"),
    m.View({"0": {"index": 0}, "1": {"index": 1}}),
    m.Closing(),
]


def test_every_kind_survives_the_wire() -> None:
    assert {type(s) for s in SAMPLES} == set(m.ALL), "a sample of every kind"
    for sample in SAMPLES:
        assert m.decode(json.loads(json.dumps(sample.to_wire()))) == sample


def test_a_malformed_message_raises_what_the_receivers_drop_and_an_unknown_kind_is_none() -> None:
    for wire in ({"node": 1}, {"t": 3, "node": 1}, {"t": "fail", "node": 1}, {"t": "put", "node": "x", "topic": "a"}):
        with pytest.raises((KeyError, TypeError, ValueError)):
            m.decode(wire)
    assert m.decode({"t": "no such kind", "node": 1}) is None
    assert m.sender({"node": 2}, 3) == 2 and m.sender({"node": 3}, 3) is None and m.sender({"node": "2"}, 3) is None


def test_the_hub_and_the_agent_each_handle_what_the_other_says() -> None:
    from launchers.control import agent_core, hub

    said_by = {side: {c.KIND for c in m.ALL if side in c.SENDERS} for side in (m.AGENT, m.HUB)}
    assert set(hub._HANDLERS) == said_by[m.AGENT]
    assert set(agent_core._HANDLERS) == said_by[m.HUB]
    reliable = {c.KIND for c in m.ALL if c.RELIABLE}
    assert reliable <= said_by[m.AGENT] and {"hello", "hb", "st"}.isdisjoint(reliable)


def strings(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every string constant of a module that is not a docstring."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_no_kind_or_wire_field_is_spelled_outside_the_protocols_module() -> None:
    names = m.wire_names()
    assert {"t", "hello", "exit_code", "generation", "node"} <= names
    definition = ROOT / "launchers" / "control" / "messages.py"
    stray = []
    for root in (ROOT / "launchers", ROOT / "benchmarks"):
        for path in sorted(root.rglob("*.py")):
            if path == definition:
                continue
            plane = path.is_relative_to(ROOT / "launchers" / "control")
            for line, text in strings(path):
                if text == m.KIND_FIELD or (plane and text in names):
                    stray.append(f"{path.relative_to(ROOT)}:{line} {text!r}")
    assert not stray, "spelled outside launchers/control/messages.py (use its classes): " + ", ".join(stray)


def test_the_spelling_check_finds_a_stray_name(tmp_path: Path) -> None:
    module = tmp_path / "stray.py"
    module.write_text('"""A docstring may say hello."""\nMESSAGE = {"t": "bye", "exit_code": 1}\n')
    found = {text for _, text in strings(module)}
    assert found == {"t", "bye", "exit_code"}
