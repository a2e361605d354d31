"""A Lightning fit whose train data cannot resume exactly mid-epoch: ``MlaunchCallback`` must say so, once.

``python lightning_inexact.py iterable|random`` fits a tiny module for 6 steps in one process on an
``IterableDataset`` without state, or a ``DataLoader(shuffle=True)`` (a ``RandomSampler``: one process gets no
``DistributedSampler``). The callback prints its line at the start of training (tests/test_trainers.py).
"""

from __future__ import annotations

import sys
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.environments import LightningEnvironment
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from launchers.elastic.integrations.lightning import MlaunchCallback


class Stream(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        for i in range(64):
            yield torch.full((4,), float(i))


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, x: Any, i: int) -> torch.Tensor:
        x = x[0] if isinstance(x, (list, tuple)) else x
        return self.net(x).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    if sys.argv[1] == "iterable":
        loader = DataLoader(Stream(), batch_size=4)
    else:
        loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4, shuffle=True)
    trainer = L.Trainer(
        max_steps=6,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[MlaunchCallback()],
        plugins=[LightningEnvironment()],  # no detection: mpi4py may be installed without an MPI library
    )
    trainer.fit(Tiny(), loader)


if __name__ == "__main__":
    main()
