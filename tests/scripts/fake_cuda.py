"""A stand-in for CUDA, for the tests of ``preload_device`` only: this machine has no GPU (CPU build of torch).

Importing it imports torch and replaces the torch.cuda calls a standby (``launchers.standby.device``)
and a training script make, with what the real ones do to a process: ``set_device`` and
``synchronize`` make a CUDA context on a device (once per device and process, as the driver's
primary context), ``is_initialized`` says whether the process made any, ``device_count`` counts
``CUDA_VISIBLE_DEVICES`` (or ``FAKE_CUDA_DEVICES``, default 4). Each context made is appended to
``FAKE_CUDA_LOG`` as ``<pid> <device> <CUDA_VISIBLE_DEVICES or ->``: the tests read which process
made a context on which device, and with which devices visible. ``contexts()`` lists this process's.
"""

from __future__ import annotations

import os

import torch

_contexts: list[int] = []
_current = [0]


def _index(device: object) -> int:
    if isinstance(device, int):
        return device
    text = str(device if device is not None else _current[0])
    return int(text.rsplit(":", 1)[-1])


def _make_context(index: int) -> None:
    if index >= device_count():
        raise RuntimeError(f"CUDA error: invalid device ordinal {index}")
    if index in _contexts:
        return
    _contexts.append(index)
    log = os.environ.get("FAKE_CUDA_LOG")
    if log:
        with open(log, "a") as out:
            out.write(f"{os.getpid()} {index} {os.environ.get('CUDA_VISIBLE_DEVICES', '-')}\n")


def is_available() -> bool:
    return device_count() > 0


def device_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    return int(os.environ.get("FAKE_CUDA_DEVICES", "4"))


def set_device(device: object) -> None:
    index = _index(device)
    _make_context(index)
    _current[0] = index


def synchronize(device: object = None) -> None:
    _make_context(_index(device))


def is_initialized() -> bool:
    return bool(_contexts)


def current_device() -> int:
    return _current[0]


def contexts() -> list[int]:
    """The devices this process made a CUDA context on, in order."""
    return list(_contexts)


for _name in ("is_available", "device_count", "set_device", "synchronize", "is_initialized", "current_device"):
    setattr(torch.cuda, _name, globals()[_name])
