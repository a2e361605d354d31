"""Slow storage for every process of a test's job: this folder on PYTHONPATH, ``TEST_SLOW_WRITE_SECONDS`` set.

The library reads no test variable (issue 33, F13): ``launchers.elastic.storage.durable`` calls its
``before_fill`` hook, None in users' jobs, once a shard file exists and before its bytes go in. A
test that needs slow storage in processes it does not run itself — mlaunch persisting staged
slots, its ranks — starts them with ``elastic_testlib.slow_storage_env(seconds)``; Python then
runs this file at start-up in each of them. Nothing is imported here: when the process itself
imports ``durable``, its hook is set to sleep ``TEST_SLOW_WRITE_SECONDS`` (read at each write, so
a script may change it between saves). A script that sets ``before_fill`` itself wins, as it
runs later.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

ENV = "TEST_SLOW_WRITE_SECONDS"
MODULE = "launchers.elastic.storage.durable"


def slow_write() -> None:
    seconds = os.environ.get(ENV)
    if seconds:
        time.sleep(float(seconds))


class _SetHookOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of ``durable`` so the hook is set right after it ran."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name != MODULE:
            return None
        sys.meta_path.remove(self)  # once, and the real finders answer the lookup below
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            module.before_fill = slow_write  # type: ignore[attr-defined]

        loader.exec_module = exec_module
        return spec


if os.environ.get(ENV):
    sys.meta_path.insert(0, _SetHookOnImport())
