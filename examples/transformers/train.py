"""A Hugging Face ``Trainer`` job under mlaunch: a small GPT-2 built from a config (nothing downloaded).

The one line of integration is ``callbacks=[MlaunchCallback()]``; the resume is transformers' own
(``resume_from_checkpoint=get_last_checkpoint(output_dir)``). Stop the job with SIGTERM, or kill -9 a
rank, at any step: it resumes from the step every rank finished and ends with the ``final-checksum`` of
a run that was never interrupted. ``--without-mlaunch`` runs the same job without the callback.

Each rank prints ``rank R pid P``, ``rank R start S`` (the step training begins from) and ``rank R
step N`` after each optimizer step; rank 0 prints
``final-checksum <sha256 of the parameters>`` and ``timing <seconds in steps> <steps> <seconds staging>
<steps staged>`` (the step time less ``--step-time``, and what mlaunch's staging took of it: benchmarks/trainers.py).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from launchers.elastic.integrations.transformers import MlaunchCallback


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())  # one write per line: ranks' lines never interleave


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Random token sequences, the same on every run (seeded)."""

    def __init__(self, n: int, length: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(1234))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Report(TrainerCallback):  # type: ignore[misc]
    def __init__(self, step_time: float) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.step_time = step_time
        self.began = self.last = time.perf_counter()
        self.steps = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        say(f"rank {self.rank} pid {os.getpid()}")
        say(f"rank {self.rank} start {state.global_step}")
        self.began = self.last = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.steps += 1
        self.last = time.perf_counter()
        say(f"rank {self.rank} step {state.global_step}")
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
    parser.add_argument("--save-every", type=int, default=20, help="the Trainer's own checkpoint (save_steps)")
    parser.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    parser.add_argument("--output", default="output/hf")
    parser.add_argument("--without-mlaunch", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=args.output,
        max_steps=args.steps,
        save_steps=args.save_every,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        seed=0,
        logging_steps=10_000,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
    )
    callbacks: list[TrainerCallback] = [] if args.without_mlaunch else [MlaunchCallback()]
    data = Tokens(256, 32, config.vocab_size)
    report = Report(args.step_time)
    trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=[*callbacks, report])
    last = get_last_checkpoint(args.output) if os.path.isdir(args.output) else None
    trainer.train(resume_from_checkpoint=last)
    if trainer.is_world_process_zero():
        say(f"final-checksum {checksum(trainer.model)}")
        say(f"done at step {trainer.state.global_step}")
        staged = (callbacks[0].session.stage_seconds, callbacks[0].session.staged_steps) if callbacks else (0.0, 0)
        say(f"timing {report.timing():.6f} {report.steps} {staged[0]:.6f} {staged[1]}")


if __name__ == "__main__":
    main()
