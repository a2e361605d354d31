"""One Lightning process stopped at given steps and resumed, without mlaunch: the exactness of
``MlaunchCallback``'s resume at and between epoch ends, in seconds rather than a 2 × 2 job's minute.

``plain_lightning.py``'s model and data (5 batches an epoch) on one device; its shuffled order comes from a
``DistributedSampler`` of one replica (what Lightning injects on several devices; a one-process
``RandomSampler`` cannot resume mid-epoch, and the callback says so). ``--stop-at N`` saves ``last.ckpt`` at the
end of step N as the callback's SIGTERM stop does (before ``ModelCheckpoint``'s own hook of that step) and ends
the process; the next run resumes from it with ``ckpt_path="last"``. Prints ``final-checksum`` at the end.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from plain_lightning import TinyGPT, Tokens, checksum, say
from torch.utils.data import DataLoader, DistributedSampler

from launchers.elastic.integrations.lightning import MlaunchCallback


class StopAt(Callback):
    """Save ``last.ckpt`` at the end of step ``step`` and end the process, as a stop of mlaunch's does."""

    def __init__(self, step: int, last: Path) -> None:
        self.step, self.last = step, last

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.last)
            say(f"stopped at step {self.step}")
            os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--stop-at", type=int, default=0)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    L.seed_everything(0, verbose=False)
    data = Tokens(20)  # 5 batches of 4
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, num_replicas=1, rank=0, seed=0))
    callbacks: list[Callback] = [MlaunchCallback()]
    if args.stop_at:
        callbacks.append(StopAt(args.stop_at, Path(args.output) / "last.ckpt"))
    callbacks.append(ModelCheckpoint(dirpath=args.output, save_last=True, every_n_train_steps=10))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    model = TinyGPT()
    trainer.fit(model, loader, ckpt_path="last")
    say(f"final-checksum {checksum(model)}")


if __name__ == "__main__":
    main()
