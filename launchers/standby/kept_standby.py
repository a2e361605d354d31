"""One standby mlaunch keeps: its process, its ready pipe, and what it may become.

mlaunch's handle on a standby (``launchers.standby.standby`` is the process's side): whether it is
ready, which warm parent forked it and when, and the device slot it initialised CUDA for
(``launchers.standby.device``). ``StandbyPool`` owns the list of them.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from launchers.standby.device import WARMED, DeviceSlot

if TYPE_CHECKING:
    from launchers.standby.warm_parent_handle import WarmParent


@dataclass
class KeptStandby:
    popen: subprocess.Popen[bytes]
    ready_fd: int
    python: str
    state: Literal["starting", "ready", "dead"] = "starting"
    parent: WarmParent | None = None  # the warm parent that forked it (None: its own interpreter)
    generation: int = 0  # the warm parent's generation when it was forked
    device: DeviceSlot | None = None  # the slot it warms CUDA for (``preload_device``; None: any rank)
    warmed: bool = False  # it said so: CUDA is initialised on ``device``

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> str:
        """Read the ready pipe without blocking: 'R' → ready, EOF → dead (a preload failed)."""
        if self.state == "starting" and self.ready_fd >= 0:
            try:
                data = os.read(self.ready_fd, 16)
            except BlockingIOError:
                return self.state
            except OSError:
                data = b""
            self.state = "ready" if data.startswith(b"R") else "dead"
            self.warmed = data[1:2] == WARMED
            self.close_ready()
        return self.state

    def fits(self, python: str, slot: DeviceSlot | None) -> bool:
        """Whether it may become a rank of ``python`` that will use ``slot``'s device: one warmed for another
        device would leave a CUDA context, and its memory, on a GPU that rank does not use."""
        if self.python != python:
            return False
        return self.device == slot or (self.state == "ready" and not self.warmed)

    def close_ready(self) -> None:
        if self.ready_fd >= 0:
            os.close(self.ready_fd)
            self.ready_fd = -1
