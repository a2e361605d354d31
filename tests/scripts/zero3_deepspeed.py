"""A DeepSpeed ZeRO-3 loop under mlaunch: a small language model with tied embeddings, ``MlaunchDeepSpeed`` as its
docs show it.

ZeRO stage 3 partitions the parameters themselves: each rank holds a slice of every weight (LayerNorms and
biases below ``stage3_param_persistence_threshold`` stay whole, "persistent"), gathers a layer's weights for its
forward and backward, and saves its own ``zero_pp_rank_<r>_mp_rank_00_model_states.pt`` and ``..._optim_states.pt``.
The data position resumes through a ``ResumableLoader`` (``MlaunchDeepSpeed(..., data=loader)``). Dropout is on:
the RNG state must come back too. The model is written in torch (input and output embeddings one parameter, as
GPT-2's): importing transformers took four ranks on CI's 2 cores some 25 s more per start, and four starts per
test; ``tests/scripts/framework_saves.py`` checks a transformers GPT-2's ZeRO-3 files in one process.

Prints what ``tests/trainer_jobs.py`` parses: ``rank R pid P``, ``rank R start S``, ``rank R step N`` and, on
rank 0, ``final-checksum <sha256 of the gathered parameters>`` (every rank gathers: a collective).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import time

import deepspeed
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from launchers.elastic.integrations.deepspeed import MlaunchDeepSpeed
from launchers.elastic.pytorch import ResumableLoader, ResumableSampler


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())


class TiedLM(torch.nn.Module):
    """Embedding, a feed-forward block with dropout, LayerNorm, and an output layer that is the embedding."""

    def __init__(self, vocab: int = 97, width: int = 32) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.block = torch.nn.Sequential(
            torch.nn.Linear(width, 2 * width), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(2 * width, width)
        )
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """The next-token loss."""
        hidden = self.embed(ids[:, :-1])
        logits = self.head(self.norm(hidden + self.block(hidden)))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


class Tokens(Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 97, (n, 16), generator=torch.Generator().manual_seed(1234))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.ids[i]


def checksum(engine: deepspeed.DeepSpeedEngine) -> str:
    """sha256 of every parameter, whole (ZeRO-3 gathers the partitions; every rank must call this)."""
    digest = hashlib.sha256()
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        for name, tensor in sorted(engine.module.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--output", default="output/zero3")
    args = parser.parse_args()
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    model = TiedLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ds_config = {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    data = Tokens(4 * 4 * 8)  # 8 steps an epoch on 4 ranks: the faults land in later epochs too
    sampler = ResumableSampler(data, rank=rank, num_replicas=world, seed=0)
    loader = ResumableLoader(DataLoader(data, batch_size=4, sampler=sampler, generator=torch.Generator()))
    mlaunch = MlaunchDeepSpeed(engine, args.output, data=loader)
    step = mlaunch.resume()
    say(f"rank {rank} pid {os.getpid()}")
    say(f"rank {rank} start {step}")
    while step < args.steps:
        for ids in loader:
            engine.backward(engine(ids))
            engine.step()
            step = int(engine.global_steps)
            mlaunch.step_end(step)  # stage; on SIGTERM every rank saves this step and exits 143
            if step % args.save_every == 0:
                mlaunch.save()
            say(f"rank {rank} step {step}")
            time.sleep(args.step_time)
            if step == args.steps:
                break
    mlaunch.finish()
    final = checksum(engine)
    if rank == 0:
        say(f"final-checksum {final}")


if __name__ == "__main__":
    main()
