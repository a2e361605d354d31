"""A PyTorch Lightning DDP job under mlaunch (CPU, gloo): a small MLP with dropout, built in code.

The one line of integration is ``MlaunchCallback()`` in the Trainer's callbacks, beside a
``ModelCheckpoint(save_last=True)``; the resume is Lightning's own (``fit(..., ckpt_path="last")``). The
data position resumes mid-epoch through ``ResumableLoader`` (Lightning restores a dataloader with
``state_dict``/``load_state_dict``). Stop the job with SIGTERM, or kill -9 a rank, at any step: it resumes
from the step every rank finished and ends with the ``final-checksum`` of an uninterrupted run.
``--without-mlaunch`` runs the same job without the callback.

Each rank prints ``rank R pid P``, ``rank R start S`` and ``rank R step N``; rank 0 prints
``final-checksum <sha256 of the parameters>`` and ``timing <seconds in steps> <steps> <seconds staging>
<steps staged>`` (the step time less ``--step-time``, and what mlaunch's staging took of it: benchmarks/trainers.py).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from launchers.elastic.integrations.lightning import MlaunchCallback
from launchers.elastic.pytorch import ResumableLoader, ResumableSampler


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())  # one write per line: ranks' lines never interleave


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Dropout(0.1), nn.Linear(64, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 7, 0.9)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class Report(Callback):
    def __init__(self, step_time: float) -> None:
        self.step_time = step_time
        self.began = self.last = time.perf_counter()
        self.steps = 0

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        say(f"rank {trainer.global_rank} pid {os.getpid()}")
        say(f"rank {trainer.global_rank} start {trainer.global_step}")
        self.began = self.last = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, *args: Any) -> None:
        self.steps += 1
        self.last = time.perf_counter()
        say(f"rank {trainer.global_rank} step {trainer.global_step}")
        time.sleep(self.step_time)

    def timing(self) -> float:
        return self.last - self.began - self.step_time * max(self.steps - 1, 0)


def checksum(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=20, help="ModelCheckpoint(every_n_train_steps=...)")
    parser.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    parser.add_argument("--output", default="output/lightning")
    parser.add_argument("--without-mlaunch", action="store_true")
    args = parser.parse_args()
    L.seed_everything(0, verbose=False)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    data = TensorDataset(torch.randn(512, 16, generator=torch.Generator().manual_seed(1)), torch.randn(512, 1))
    sampler = ResumableSampler(data, rank=rank, num_replicas=world, seed=0)
    loader = ResumableLoader(DataLoader(data, batch_size=8, sampler=sampler, generator=torch.Generator()))
    checkpoints = ModelCheckpoint(dirpath=args.output, save_last=True, every_n_train_steps=args.save_every)
    mlaunch: list[Callback] = [] if args.without_mlaunch else [MlaunchCallback()]
    report = Report(args.step_time)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=world // int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy="ddp",
        max_steps=args.steps,
        use_distributed_sampler=False,  # the ResumableSampler shares the data out itself
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*mlaunch, checkpoints, report],
    )
    model = Regression()
    trainer.fit(model, loader, ckpt_path="last")
    if trainer.is_global_zero:
        say(f"final-checksum {checksum(model)}")
        say(f"done at step {trainer.global_step}")
        session = mlaunch[0].session if mlaunch and isinstance(mlaunch[0], MlaunchCallback) else None
        staged = (session.stage_seconds, session.staged_steps) if session else (0.0, 0)
        say(f"timing {report.timing():.6f} {report.steps} {staged[0]:.6f} {staged[1]}")


if __name__ == "__main__":
    main()
