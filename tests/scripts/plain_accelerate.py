"""An Accelerate loop as its docs show it, under mlaunch: a tied-embedding GPT-2 from config, a plain shuffled
``DataLoader`` through ``accelerator.prepare``, ``skip_first_batches`` on resume, ``MlaunchAccelerate``.

The issue-48 case: after a kill -9 the step mlaunch materialised as Accelerate's checkpoint held both tied names
and every restarted rank failed in ``load_state``. The dataset is one epoch long over the run (a prepared
loader's shuffle generator is not in Accelerate's checkpoint: a resume in a later epoch shuffles differently).
Prints what ``tests/trainer_jobs.py`` parses: ``rank R pid P``, ``rank R start S``, ``rank R step N`` and, on
rank 0, ``final-checksum <sha256 of the parameters>``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel

from launchers.elastic.integrations.accelerate import MlaunchAccelerate


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())


class Tokens(Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 97, (n, 16), generator=torch.Generator().manual_seed(1234))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.ids[i]


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
    parser.add_argument("--output", default="output/accelerate")
    args = parser.parse_args()
    project = ProjectConfiguration(project_dir=args.output, automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=project)
    set_seed(0)
    rank = accelerator.process_index
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=16, tie_word_embeddings=True)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(Tokens(4 * 4 * args.steps), batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    mlaunch = MlaunchAccelerate(accelerator, model=model)
    step = mlaunch.resume()
    say(f"rank {rank} pid {os.getpid()}")
    say(f"rank {rank} start {step}")
    batches = accelerator.skip_first_batches(loader, step) if step else loader
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        mlaunch.step_end(step)  # stage; on SIGTERM every rank saves this step and exits 143
        if step % args.save_every == 0:
            mlaunch.save()
        say(f"rank {rank} step {step}")
        time.sleep(args.step_time)
        if step == args.steps:
            break
    mlaunch.finish()
    if accelerator.is_main_process:
        say(f"final-checksum {checksum(accelerator.unwrap_model(model))}")


if __name__ == "__main__":
    main()
