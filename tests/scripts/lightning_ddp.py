"""A plain Lightning DDP script (CPU, gloo), as a user writes it: no mlaunch API, no launcher flags.

Lightning finds its cluster from torchrun's env (``TorchElasticEnvironment``: RANK, GROUP_RANK,
LOCAL_RANK, LOCAL_WORLD_SIZE, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), which mlaunch sets per
rank; ``--nodes``/``--devices`` must match the job (Lightning checks WORLD_SIZE against them).

Each rank prints ``pid <rank> <pid>`` once the process group is up, and rank 0 prints
``step <n> <time.monotonic()>`` after each optimizer step (one clock for every process of the
machine, so a test can time a restart from its own kill), then ``done <steps>`` at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())  # one write per line: ranks' lines never interleave


class Regression(L.LightningModule):
    def __init__(self, step_time: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
        self.step_time = step_time

    def on_train_start(self) -> None:
        say(f"pid {self.global_rank} {os.getpid()}")

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        if self.global_rank == 0:
            say(f"step {self.global_step} {time.monotonic():.6f}")
        kill = os.environ.get("LIGHTNING_KILL_AT")  # "RANK:STEP:MARKER": that rank kill -9s itself once
        if kill:
            rank, step, marker = kill.split(":", 2)
            if self.global_rank == int(rank) and self.global_step == int(step) and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), 9)
        time.sleep(self.step_time)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--restart-steps", type=int, default=None, help="steps of a restarted job (default --steps)")
    parser.add_argument("--step-time", type=float, default=0.05)
    args = parser.parse_args()
    # The test kills the first attempt when it likes (mlaunch's warm standbys must be ready first, which
    # takes long on a loaded machine); a restarted job (torchrun's env, set by mlaunch) may be short.
    restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
    steps = args.restart_steps if restarted and args.restart_steps else args.steps
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.nodes,
        strategy="ddp",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regression(args.step_time), DataLoader(data, batch_size=8))
    if trainer.global_rank == 0:
        say(f"done {trainer.global_step}")


if __name__ == "__main__":
    if os.environ.get("LIGHTNING_RECOVERABLE") == "1":  # the same script under @elastic.recoverable
        from launchers import elastic

        elastic.recoverable(main)()
    else:
        main()
