"""Spare the ``mlaunch`` command pydantic's plugin scan: about 25 ms of every start.

The first time pydantic builds a validator it imports its plugin loader, which imports
``importlib.metadata`` (and with it ``email``, ``zipfile``, ``csv``) and reads the entry points
of every distribution installed in the environment — a training venv holds hundreds. The
validators ``mlaunch`` builds are its own (job.yaml's model, typer's parameters), and a pydantic
plugin (an observability hook, say) has nothing to do with them, so the command line runs
without plugins, as ``PYDANTIC_DISABLE_PLUGINS=__all__`` would, minus the import.

Only the ``mlaunch`` process does this (``launchers.cli.main`` calls ``install``): a training
script that imports ``launchers.elastic`` keeps its pydantic untouched, and the environment the
ranks inherit is not changed. Anything else a future pydantic wants from its loader module is
loaded from the real module on first use, so a pydantic upgrade costs time, never a crash.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterable
from typing import Any

LOADER = "pydantic.plugin._loader"


def install() -> bool:
    """Put a plugin-less loader in place unless pydantic's own is already loaded; True if done."""
    if LOADER in sys.modules:
        return False
    try:
        spec = importlib.util.find_spec(LOADER)  # imports ``pydantic.plugin`` only: no validators, no scan
    except ImportError:
        return False
    if spec is None or spec.loader is None:
        return False
    stub = types.ModuleType(LOADER, __doc__)
    real: list[types.ModuleType] = []

    def get_plugins() -> Iterable[Any]:
        return ()

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):  # the import system asks for ``__path__`` and the like: not pydantic's API
            raise AttributeError(name)
        if not real:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)  # type: ignore[union-attr]
            real.append(module)
        return getattr(real[0], name)

    stub.get_plugins = get_plugins  # type: ignore[attr-defined]
    stub.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[LOADER] = stub
    return True
