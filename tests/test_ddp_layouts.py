"""What a staged shard's header says about DDP's gradient bucket layout, step by step (one real gloo rank).

A resume reduces its first step with the layout recorded here (``launchers.elastic.ddp_layouts``); a header that
lacks it after DDP's rebuild makes the resumed run differ from the uninterrupted one in the last bits.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from launchers.elastic import ddp_layouts  # noqa: E402


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def group() -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
        ddp_layouts.forget_models()


def _step(model: Any) -> None:
    model(torch.ones(4, 8)).sum().backward()


def test_the_layout_is_recorded_from_the_step_that_rebuilt_it(group: None) -> None:
    """Step 1: the rebuild is pending (marked, no layout); step 2 rebuilt it inside its forward: the header of the
    step staged right then carries it (DDP's logging data says so only from step 3's forward)."""
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    )
    assert ddp_layouts.header() == {}  # no forward yet: a resume would start with the constructor's, as this did
    _step(model)
    after_first = ddp_layouts.header()
    assert "ddp_buckets" not in after_first and after_first["ddp_buckets_pending"] == [0], after_first
    _step(model)
    after_second = ddp_layouts.header()
    assert "ddp_buckets_pending" not in after_second, after_second
    [entry] = after_second["ddp_buckets"]
    assert entry["index"] == 0 and sorted(i for b in entry["buckets"] for i in b) == [0, 1, 2, 3], entry


def test_find_unused_parameters_keeps_the_constructors_layout_and_is_never_pending(group: None) -> None:
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1), find_unused_parameters=True)
    _step(model)
    _step(model)
    assert ddp_layouts.header() == {}


def test_a_job_grown_from_two_ranks_to_three_reduces_with_one_layout_on_every_rank(tmp_path: Path) -> None:
    """The new rank 2 has no shard of its own in the 2-rank checkpoint: it once read no layout while ranks 0-1 set
    the recorded one, and its reducer ordered the bucket unlike theirs — gloo then summed one parameter's gradient
    into another's, silently (seen in a chaos storm as a later resize refusing the "replicated" state that had
    drifted apart). Real gloo ranks on loopback (``tests/scripts/ddp_grow_layout.py``)."""
    script = Path(__file__).resolve().parent / "scripts" / "ddp_grow_layout.py"
    env = {**os.environ, "PYTHONPATH": str(script.parent.parent.parent)}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt")], capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0, done.stderr[-4000:]
    said = [json.loads(m) for m in re.findall(r'\{"rank": \d, "layout": [^}]*\}', done.stdout)]
    assert sorted(s["rank"] for s in said) == [0, 1, 2], done.stdout
    layouts = {json.dumps(s["layout"]) for s in said}
    assert len(layouts) == 1, said
