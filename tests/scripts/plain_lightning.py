"""Lightning as its docs show it, under mlaunch: a tied-embedding GPT-2 from config, a plain shuffled ``DataLoader``.

No ``ResumableLoader``: Lightning injects its ``DistributedSampler`` (several devices) and the one line
``callbacks=[MlaunchCallback(), ModelCheckpoint(save_last=True)]`` must resume the data where the loop left it
(``tests/test_trainers.py``). The dataset is small (a few batches per epoch per rank) so a resume lands mid-epoch
in a later epoch. Prints what ``tests/trainer_jobs.py`` parses: ``rank R pid P``, ``rank R start S``, ``rank R
step N`` and, on rank 0, ``final-checksum <sha256 of the parameters>``.
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
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel

from launchers.elastic.integrations.lightning import MlaunchCallback


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())  # one write per line: ranks' lines never interleave


class Tokens(Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 97, (n, 16), generator=torch.Generator().manual_seed(1234))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.ids[i]


class TinyGPT(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=16, tie_word_embeddings=True)
        self.gpt = GPT2LMHeadModel(config)  # dropout 0.1: the RNG must resume too

    def training_step(self, ids: torch.Tensor, i: int) -> torch.Tensor:
        return self.gpt(input_ids=ids, labels=ids).loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Report(Callback):
    def __init__(self, step_time: float) -> None:
        self.step_time = step_time

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        say(f"rank {trainer.global_rank} pid {os.getpid()}")
        say(f"rank {trainer.global_rank} start {trainer.global_step}")

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, *args: Any) -> None:
        say(f"rank {trainer.global_rank} step {trainer.global_step}")
        time.sleep(self.step_time)


def checksum(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--shuffle", type=int, default=1)
    parser.add_argument("--output", default="output/lightning")
    args = parser.parse_args()
    L.seed_everything(0, verbose=False)
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    loader = DataLoader(Tokens(80), batch_size=4, shuffle=bool(args.shuffle))  # 5 batches per rank of 4
    trainer = L.Trainer(
        accelerator="cpu",
        devices=per_node,
        num_nodes=int(os.environ.get("WORLD_SIZE", "1")) // per_node,
        strategy="ddp",
        max_steps=args.steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            MlaunchCallback(),
            ModelCheckpoint(dirpath=args.output, save_last=True, every_n_train_steps=args.save_every),
            Report(args.step_time),
        ],
    )
    model = TinyGPT()
    trainer.fit(model, loader, ckpt_path="last")
    if trainer.is_global_zero:
        say(f"final-checksum {checksum(model)}")


if __name__ == "__main__":
    main()
