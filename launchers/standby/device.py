"""A standby ready for its rank's GPU: CUDA initialised on the device that rank will use, before it is needed.

A replacement rank that starts from a standby has torch imported, but on a GPU machine it still pays
CUDA's start (the driver, the primary context on its device: 0.65 s per rank on an H100, issue 44)
between its hand-off and its first step. A standby kept for one local slot can pay that while it
waits: ``preload_device`` (job.yaml, on by default) makes each standby initialise CUDA on the device its
slot's rank will use, after it was forked (the warm parent never touches CUDA, and a standby never
forks once it has), so the replacement's own ``torch.cuda.set_device(local_rank)`` finds the context
made.

Which device: torchrun's convention, the one the scripts follow — ``LOCAL_RANK`` among the devices
``CUDA_VISIBLE_DEVICES`` shows (modulo their number, when ranks share them), or device 0 when the rank
sees exactly one. A standby warmed for one slot is handed only to a rank with the same slot (the same
visible devices and index): one warmed for another device would leave a context, and its memory, on a
GPU its rank does not use. Without torch imported ahead (``preload:``, or learned), or without a CUDA
device, nothing is done. The cost: each idle standby holds one CUDA context on its device (some hundred
MiB of GPU memory); ``preload_device: false`` gives it back. Ascend NPUs (torch_npu) are not warmed.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

DEVICE_ENV = "MLAUNCH_STANDBY_DEVICE"  # an exec'd standby's slot (``DeviceSlot.encode``; a fork request: the same)
WARMED = b"D"  # after ready's ``R``: this standby initialised CUDA on its slot's device


@dataclass(frozen=True)
class DeviceSlot:
    """The device a rank will use: its ``CUDA_VISIBLE_DEVICES`` (None: unset) and the index among them."""

    visible: str | None
    index: int

    def encode(self) -> str:
        return f"{self.index}:{self.visible}" if self.visible is not None else str(self.index)

    @classmethod
    def decode(cls, text: str) -> DeviceSlot | None:
        index, sep, visible = text.partition(":")
        if not index.isdigit():
            return None
        return cls(visible if sep else None, int(index))


def device_slot(env: dict[str, str]) -> DeviceSlot | None:
    """The device a rank with ``env`` will use, by torchrun's convention (None: it names none).

    One visible device: index 0 whatever the local rank (a platform that gives each rank its own
    GPU). Otherwise ``LOCAL_RANK``. An empty or ``-1`` list hides every device: None.
    """
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d for d in visible.split(",") if d.strip()]
        if not devices or devices[0].strip() == "-1":
            return None
        if len(devices) == 1:
            return DeviceSlot(visible, 0)
    local = env.get("LOCAL_RANK", "")
    return DeviceSlot(visible, int(local)) if local.isdigit() else None


def warm_device(slot: DeviceSlot) -> bool:
    """In a standby, after its fork: initialise CUDA on ``slot``'s device; True when it did.

    ``CUDA_VISIBLE_DEVICES`` is set as the rank will have it before CUDA reads it (the rank's own
    environment replaces this one at the hand-off; the context stays). ``synchronize`` makes the
    primary context on the current device (``set_device`` alone may defer it). Any error leaves the
    standby as it was: the rank then starts CUDA itself, as without this.
    """
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return False
    if slot.visible is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = slot.visible
    try:
        count = cuda.device_count() if cuda.is_available() else 0
        if count <= 0:
            return False
        index = slot.index % count  # more ranks than devices: scripts share them as ``local_rank % device_count``
        cuda.set_device(index)
        cuda.synchronize(index)
    except Exception as exc:  # noqa: BLE001 - a standby that cannot warm its device is still a standby
        sys.stderr.write(f"mlaunch standby: CUDA not initialised ahead on device {slot.index}: {exc}\n")
        return False
    return True
