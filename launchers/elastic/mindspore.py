"""MindSpore: ``ExceptionCheckpoint``, the dying-checkpoint callback ModelArts users know.

ModelArts' graceful exit for MindSpore has training scripts add
``mindx_elastic.terminating_message.ExceptionCheckpoint(prefix=..., directory=..., config=...)``
to ``model.train``'s callbacks: when the platform sends SIGTERM, the job saves a checkpoint
("临终 ckpt") and the restarted job resumes from it. This callback does the same, on mlaunch's
protocol:

- SIGTERM/SIGINT/SIGUSR1 only set the flag (``elastic.install()``);
- at every step end all ranks agree (one all-reduce over MindSpore's communication when it
  is initialised), so every rank saves the *same* step;
- each rank writes its network with ``mindspore.save_checkpoint`` into ``step_N.tmp/`` and
  rank 0 commits after all have (``Checkpointer.save``: marker last, keep last k);
- then it asks the model to stop and exits 143.

Resume with ``ExceptionCheckpoint.latest(directory)`` → this rank's ``.ckpt`` file of the
newest committed step (or None) → ``mindspore.load_checkpoint`` / ``load_param_into_net``.
``config`` (a ``CheckpointConfig``) is accepted for compatibility: its ``keep_checkpoint_max``
becomes the number of checkpoints kept and its ``append_info`` is saved along.

Importing this module imports MindSpore (it subclasses its ``Callback``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mindspore.train import Callback

from launchers.elastic.checkpoint import Checkpointer
from launchers.elastic.guard import EXIT_CODE, Guard, install

CKPT_EXT = ".ckpt"


class ExceptionCheckpoint(Callback):
    """Save a committed checkpoint at the step end after SIGTERM, stop training, exit 143."""

    def __init__(
        self,
        prefix: str = "CKP",
        directory: str | os.PathLike[str] | None = None,
        config: Any = None,
        *,
        guard: Guard | None = None,
        exit_code: int | None = EXIT_CODE,
    ) -> None:
        super().__init__()
        self.prefix = prefix
        keep = getattr(config, "keep_checkpoint_max", None) if config is not None else None
        self.append_info = getattr(config, "append_info", None) if config is not None else None
        self.checkpointer = Checkpointer(directory, keep=int(keep) if keep else None)
        self.guard = guard or install()
        self.exit_code = exit_code  # None: stop training and return from model.train instead of exiting
        self.saved: Path | None = None

    @staticmethod
    def latest(directory: str | os.PathLike[str] | None = None) -> Path | None:
        """This rank's checkpoint file of the newest committed step, or None."""
        return Checkpointer(directory).latest_shard()

    def on_train_step_end(self, run_context: Any) -> None:
        cb_params = run_context.original_args()
        step = int(cb_params.cur_step_num)
        if not self.guard.should_stop(step):
            return
        self.saved = self._save(cb_params, step)
        run_context.request_stop()
        if self.exit_code is not None:
            self.guard.exit(self.exit_code)

    # MindSpore calls ``step_end`` on old-style callbacks; both names work.
    step_end = on_train_step_end

    def _save(self, cb_params: Any, step: int) -> Path:
        import mindspore as ms

        network = cb_params.train_network
        epoch = int(getattr(cb_params, "cur_epoch_num", 0))
        extra: dict[str, Any] = {"epoch_num": epoch, "step_num": step, "prefix": self.prefix}
        for item in self.append_info or []:
            if isinstance(item, dict):
                extra.update(item)

        def writer(path: Path) -> int:
            ms.save_checkpoint(network, str(path), append_dict=extra)
            return path.stat().st_size

        return self.checkpointer.save(step, None, writer=writer, ext=CKPT_EXT)
