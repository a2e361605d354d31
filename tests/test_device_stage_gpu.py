"""Staging CUDA state for real: what a slot holds is the state at the staged step, bit for bit.

Runs only where torch sees a GPU (skipped elsewhere, CI included: it has none). The ordering logic
is tested on CPU in ``test_device_stage.py``; this is the part only a device can show — the side
stream reads the step the compute stream just finished, and the fence keeps the optimizer from
changing a parameter before its copy left the device, in both fence modes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from launchers.elastic.format import shardfile
from launchers.elastic.ipc import device_stage, staging

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def training(width: int = 2048, layers: int = 4) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4096, width, device="cuda")
    return model, optimizer, x


def step(model: Any, optimizer: Any, x: Any) -> None:
    model(x).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("overlap", [False, True], ids=["fence-now", "fence-at-optimizer-step"])
def test_a_slot_holds_the_staged_step_while_the_optimizer_moves_on(tmp_path: Path, overlap: bool) -> None:
    model, optimizer, x = training()
    segment = staging.Segment(str(tmp_path / "mlaunch.gpu.rank0"), 0, 1, 0)
    stager = device_stage.DeviceStager(device_stage.TorchCopies(overlap))
    try:
        for n in range(1, 6):
            step(model, optimizer, x)
            expected = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
            moments = {k: v["exp_avg"].cpu().clone() for k, v in optimizer.state.items()}
            state = {"model": model.state_dict(), "optim": optimizer.state_dict(), "step": n}
            stager.stage(segment, n, shardfile.encode(state, on_device=True))
            step(model, optimizer, x)  # every parameter and moment changes in place right away
            stager.wait()
            with staging.SegmentReader(segment.path) as reader:
                slot = max((s for s in reader.slots() if s.complete), key=lambda s: (s.step, s.seq))
                decoded, _ = shardfile.decode(bytearray(reader.data(slot)))
            assert slot.step == n
            for key, value in expected.items():
                assert torch.equal(decoded["model"][key], value), f"step {n}: {key} is not the staged value"
            for index, (key, value) in enumerate(moments.items()):
                assert torch.equal(decoded["optim"]["state"][index]["exp_avg"], value), f"step {n}: moment {key}"
        assert stager.allocations == 1, "one pinned buffer for every step"
        assert stager.host is not None and stager.host.nbytes <= segment.capacity
    finally:
        segment.close()
