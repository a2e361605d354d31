"""A DeepSpeed job under mlaunch (CPU: ``DS_ACCELERATOR=cpu``, gloo): a small MLP with dropout, built in code.

The integration is ``mlaunch = MlaunchDeepSpeed(engine, save_dir, data=loader)`` with ``step =
mlaunch.resume()`` before the loop and ``mlaunch.step_end(step)`` after each ``engine.step()``; the
checkpoints are DeepSpeed's own (``engine.save_checkpoint``/``load_checkpoint``, ``global_step<N>/`` and
``latest``), ZeRO stage ``--zero`` (0, 1 or 2). The data position resumes mid-epoch through a
``ResumableLoader``. Stop the job with SIGTERM, or kill -9 a rank, at any step: it resumes from the step
every rank finished and ends with the ``final-checksum`` of an uninterrupted run. ``--without-mlaunch``
runs the same job with DeepSpeed alone (periodic ``save_checkpoint``, ``load_checkpoint`` of ``latest``).

Each rank prints ``rank R pid P``, ``rank R start S`` and ``rank R step N``; rank 0 prints
``final-checksum <sha256 of the parameters>`` and ``timing <seconds in steps> <steps> <seconds staging>
<steps staged>`` (the step time less ``--step-time``, and what mlaunch's staging took of it: benchmarks/trainers.py).
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
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from launchers.elastic.integrations.deepspeed import MlaunchDeepSpeed
from launchers.elastic.pytorch import ResumableLoader, ResumableSampler


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())  # one write per line: ranks' lines never interleave


def checksum(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=20, help="engine.save_checkpoint every N steps")
    parser.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    parser.add_argument("--zero", type=int, default=1, choices=(0, 1, 2), help="ZeRO stage")
    parser.add_argument("--output", default="output/deepspeed")
    parser.add_argument("--without-mlaunch", action="store_true")
    args = parser.parse_args()
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Dropout(0.1), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 7, 0.9)
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": args.zero},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config)
    data = TensorDataset(torch.randn(512, 16, generator=torch.Generator().manual_seed(1)), torch.randn(512, 1))
    sampler = ResumableSampler(data, rank=rank, num_replicas=world, seed=0)
    loader = ResumableLoader(DataLoader(data, batch_size=8, sampler=sampler, generator=torch.Generator()))

    if args.without_mlaunch:  # DeepSpeed alone: the data position rides in its client_state
        _path, client = engine.load_checkpoint(args.output)  # (None, None) without a 'latest' file
        if client and "data" in client:
            loader.load_state_dict(client["data"])
    else:
        mlaunch = MlaunchDeepSpeed(engine, args.output, data=loader)
        mlaunch.resume()
    step = int(engine.global_steps)
    say(f"rank {rank} pid {os.getpid()}")
    say(f"rank {rank} start {step}")
    began = last = time.perf_counter()
    steps_run = 0

    while step < args.steps:
        for x, y in loader:
            engine.backward(nn.functional.mse_loss(engine(x), y))
            engine.step()
            step = int(engine.global_steps)
            if args.without_mlaunch:
                if step % args.save_every == 0:
                    engine.save_checkpoint(args.output, client_state={"data": loader.state_dict()})
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
    if rank == 0:
        say(f"final-checksum {checksum(engine.module)}")
        say(f"done at step {step}")
        staged = (0.0, 0) if args.without_mlaunch else (mlaunch.session.stage_seconds, mlaunch.session.staged_steps)
        seconds = last - began - args.step_time * max(steps_run - 1, 0)
        say(f"timing {seconds:.6f} {steps_run} {staged[0]:.6f} {staged[1]}")


if __name__ == "__main__":
    main()
