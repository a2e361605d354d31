"""Engine registry.

An engine is a module in this package with a class implementing ``Engine`` (see
``base.py``). It is imported only when asked for, so ``mlaunch --engine pytorch`` never
pays for the Ascend or TensorFlow code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from launchers.errors import UserError

if TYPE_CHECKING:
    from launchers.engines.base import Engine

ENGINE_MODULES = {
    "pytorch": "launchers.engines.pytorch",
    "ascend": "launchers.engines.ascend",
    "tensorflow": "launchers.engines.tensorflow",
    "mpi": "launchers.engines.mpi",
}


def get_engine(name: str) -> Engine:
    """Instantiate the engine called ``name``; an unknown name is a user error listing the known ones."""
    module_name = ENGINE_MODULES.get(name)
    if module_name is None:
        raise UserError(f"unknown engine {name!r}; expected one of: {', '.join(ENGINE_MODULES)}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise UserError(f"engine {name!r} is not available in this version of mlaunch") from None
        raise
    engine: Engine = module.ENGINE
    return engine
