"""An Accelerate job under mlaunch (CPU, gloo): a small MLP with dropout, built in code.

The integration is ``mlaunch = MlaunchAccelerate(accelerator, model=model)`` with ``step = mlaunch.resume()`` before
the loop and ``mlaunch.step_end(step)`` after each optimizer step; the checkpoints are Accelerate's own
(``save_state``/``load_state``, ``ProjectConfiguration(automatic_checkpoint_naming=True)``). The data
position resumes mid-epoch through a ``ResumableLoader`` registered with ``register_for_checkpointing``.
Stop the job with SIGTERM, or kill -9 a rank, at any step: it resumes from the step every rank finished
and ends with the ``final-checksum`` of an uninterrupted run. ``--without-mlaunch`` runs the same job
with Accelerate alone (periodic ``save_state``, ``load_state`` of the newest one).

Each rank prints ``rank R pid P``, ``rank R start S`` and ``rank R step N``; rank 0 prints
``final-checksum <sha256 of the parameters>`` and ``timing <seconds in steps> <steps> <seconds staging>
<steps staged>`` (the step time less ``--step-time``, and what mlaunch's staging took of it: benchmarks/trainers.py).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from launchers.elastic.integrations.accelerate import MlaunchAccelerate
from launchers.elastic.pytorch import ResumableLoader, ResumableSampler


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())  # one write per line: ranks' lines never interleave


class Steps:
    """The step counter of the run without mlaunch (MlaunchAccelerate records the step itself)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def checksum(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=20, help="accelerator.save_state every N steps")
    parser.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    parser.add_argument("--output", default="output/accelerate")
    parser.add_argument("--without-mlaunch", action="store_true")
    args = parser.parse_args()
    project = ProjectConfiguration(project_dir=args.output, automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=project)
    set_seed(0)
    rank = accelerator.process_index
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Dropout(0.1), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 7, 0.9)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    data = TensorDataset(torch.randn(512, 16, generator=torch.Generator().manual_seed(1)), torch.randn(512, 1))
    sampler = ResumableSampler(data, rank=rank, num_replicas=accelerator.num_processes, seed=0)
    loader = ResumableLoader(DataLoader(data, batch_size=8, sampler=sampler, generator=torch.Generator()))
    accelerator.register_for_checkpointing(loader)  # its position is saved in each checkpoint

    if args.without_mlaunch:
        steps = Steps()
        accelerator.register_for_checkpointing(steps)
        checkpoints = Path(args.output, "checkpoints")
        if checkpoints.is_dir() and any(checkpoints.iterdir()):
            accelerator.load_state()  # the newest checkpoint_<i>
            accelerator.project_configuration.iteration = len(list(checkpoints.iterdir()))
        step = steps.step
    else:
        mlaunch = MlaunchAccelerate(accelerator, model=model)
        step = mlaunch.resume()
    say(f"rank {rank} pid {os.getpid()}")
    say(f"rank {rank} start {step}")
    began = last = time.perf_counter()
    steps_run = 0

    while step < args.steps:
        for x, y in loader:
            optimizer.zero_grad()
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            scheduler.step()
            step += 1
            if args.without_mlaunch:
                steps.step = step
                if step % args.save_every == 0:
                    accelerator.save_state()
            else:
                mlaunch.step_end(step)  # stage; on SIGTERM every rank saves this step and exits 143
                if step % args.save_every == 0:
                    mlaunch.save()
            steps_run += 1
            last = time.perf_counter()
            say(f"rank {rank} step {step}")
            time.sleep(args.step_time)
            if step == args.steps:
                break
    if not args.without_mlaunch:
        mlaunch.finish()
    if accelerator.is_main_process:
        say(f"final-checksum {checksum(accelerator.unwrap_model(model))}")
        say(f"done at step {step}")
        staged = (0.0, 0) if args.without_mlaunch else (mlaunch.session.stage_seconds, mlaunch.session.staged_steps)
        seconds = last - began - args.step_time * max(steps_run - 1, 0)
        say(f"timing {seconds:.6f} {steps_run} {staged[0]:.6f} {staged[1]}")


if __name__ == "__main__":
    main()
