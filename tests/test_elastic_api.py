"""The ``launchers.elastic`` surface training scripts use, and what the launcher itself loads.

The package resolves its API lazily (PEP 562), so mlaunch's own import of
``launchers.elastic.ipc.staging`` at every start does not pay for the guard and checkpoint code,
while ``elastic.install``, ``elastic.Checkpointer``, ``from launchers.elastic import *`` and
submodules as attributes (``elastic.guard``) work as with eager imports. Each check runs in
a fresh interpreter, because what is already imported is the point.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT, clean_env


def _python(code: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", code], env=clean_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_launchers_import_of_staging_leaves_guard_and_checkpoint_unloaded() -> None:
    seen = _python(
        "import json, sys\nimport launchers.elastic.ipc.staging\n"
        "print(json.dumps({m: m in sys.modules for m in ('launchers.elastic.guard', 'launchers.elastic.checkpoint')}))"
    )
    assert seen == {"launchers.elastic.guard": False, "launchers.elastic.checkpoint": False}


def test_the_documented_api_and_submodules_are_reachable() -> None:
    seen = _python(
        "import json\nfrom launchers import elastic\nfrom launchers.elastic import *\n"
        "print(json.dumps({'install': callable(elastic.install),"
        " 'beat': callable(elastic.heartbeat), 'ckpt': elastic.Checkpointer.__name__,"
        " 'code': EXIT_CODE, 'star': sorted(n for n in elastic.__all__ if n in globals()),"
        " 'guard': elastic.guard.Guard is elastic.Guard, 'missing': hasattr(elastic, 'no_such_name')}))"
    )
    assert seen["install"] is True and seen["ckpt"] == "Checkpointer" and seen["code"] == 143
    assert seen["star"] == sorted(
        [
            "EXIT_CODE",
            "CheckpointError",
            "Checkpointer",
            "GracefulExit",
            "Guard",
            "finished",
            "heartbeat",
            "install",
            "recoverable",
            "waiting",
        ]
    )
    assert seen["guard"] is True and seen["missing"] is False
