"""Hugging Face ``Trainer``: ``Trainer(..., callbacks=[MlaunchCallback()])``.

::

    from launchers.elastic.integrations.transformers import MlaunchCallback
    from transformers.trainer_utils import get_last_checkpoint

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[MlaunchCallback()])
    trainer.train(resume_from_checkpoint=get_last_checkpoint(args.output_dir))   # or resume_from_checkpoint=True

What the callback does:

- **SIGTERM**: mlaunch's flag replaces an immediate stop; at the end of each optimizer step every rank
  checks it (one all-reduce), and all stop at the same step: the ``Trainer`` saves ``checkpoint-N``
  itself (``control.should_save``), then every rank leaves with 143. transformers' own opt-in SIGTERM
  save is not needed (it waits a fixed time and lets each rank decide alone).
- **kill -9 / crash**: at each step end every rank stages what ``checkpoint-N`` would hold for it (rank 0:
  model, optimizer, scheduler and ``trainer_state.json``; every rank its RNG state) in shared memory.
  mlaunch commits the newest step every rank staged. When the ``Trainer`` is built again
  (``on_init_end``), that step is written as ``<output_dir>/checkpoint-N`` if it is newer than the newest
  complete ``checkpoint-*`` there, so ``get_last_checkpoint`` and the ``Trainer``'s own resume (weights,
  optimizer, scheduler, RNG, and the data position from ``global_step``) take it.
- **the end**: the rank reports completion to mlaunch and the process group ends at exit.

Limits: data-parallel training (DDP or one process): DeepSpeed or FSDP inside the ``Trainer`` keep their
state outside what is staged here; ``get_last_checkpoint`` must be called after the ``Trainer`` is built
(the materialised checkpoint is written in ``on_init_end``); fp16 loss-scaler state is not staged.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launchers.elastic.integrations._session import Session, rank_world, write_once

__all__ = ["MlaunchCallback"]

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


class MlaunchCallback(TrainerCallback):
    """Nothing lost on SIGTERM or kill -9 under mlaunch, in the ``Trainer``'s own checkpoint format."""

    def __init__(self) -> None:
        self.session = Session()
        self.resumed_from: int | None = None  # the step materialised from mlaunch's commit, if any

    # -- start: mlaunch's commit as checkpoint-N ---------------------------------------
    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self.session.install()
        output = Path(args.output_dir)
        got = self.session.newer_commit(newest_complete(output))
        if got is None:
            return
        step, saved = got
        model = kw.get("model")
        write_once(output / f"checkpoint-{step}", step, lambda tmp: _write(tmp, saved, model), every_rank=True)
        self.resumed_from = step

    # -- each step: stage, then agree on a stop ----------------------------------------
    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        step = state.global_step
        if self.session.wants_stage():
            self.session.stage_built(step, lambda: _capture(args, state, control, kw))
        if self.session.should_stop(step):
            control.should_save = True  # the Trainer writes checkpoint-N, then calls on_save
            control.should_training_stop = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if self.session.stop_step is not None and state.global_step == self.session.stop_step:
            from launchers.elastic.integrations._session import barrier

            barrier()  # every rank's files of checkpoint-N are written
            self.session.stop()

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self.session.finished()


def newest_complete(output: Path) -> int | None:
    """The newest ``checkpoint-N`` in ``output`` that holds its ``trainer_state.json`` (written last)."""
    steps = []
    if output.is_dir():
        for child in output.iterdir():
            m = _CHECKPOINT.match(child.name)
            if m and (child / "trainer_state.json").is_file():
                steps.append(int(m.group(1)))
    return max(steps, default=None)


def _rng_state() -> dict[str, Any]:
    """The RNG streams the ``Trainer`` saves in ``rng_state*.pth`` (CPU training)."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.random.get_rng_state_all()
    return state


def _capture(args: TrainingArguments, state: TrainerState, control: TrainerControl, kw: dict[str, Any]) -> Any:
    """This rank's part of ``checkpoint-<step>``: references to the tensors (staging copies them)."""
    captured: dict[str, Any] = {"step": state.global_step, "rng": _rng_state()}
    if args.should_save:  # the process that writes the shared files of a checkpoint
        as_json = dataclasses.asdict(state)
        as_json.setdefault("stateful_callbacks", {})["TrainerControl"] = control.state()
        captured["model"] = kw["model"].state_dict()
        captured["optimizer"] = kw["optimizer"].state_dict()
        scheduler = kw.get("lr_scheduler")
        if scheduler is not None:
            captured["scheduler"] = scheduler.state_dict()
        captured["trainer_state"] = json.dumps(as_json, indent=2, sort_keys=True) + "\n"
    return captured


def _write(tmp: Path, saved: dict[str, Any], model: Any) -> None:
    """Write this rank's files of the native checkpoint into ``tmp`` (``trainer_state.json`` last)."""
    rank, world = rank_world()
    rng = dict(saved["rng"])
    version, internal, gauss = rng["python"]
    rng["python"] = (version, tuple(internal), gauss)
    rng["numpy"] = tuple(rng["numpy"])
    torch.save(rng, tmp / ("rng_state.pth" if world <= 1 else f"rng_state_{rank}.pth"))
    if "model" not in saved:
        return
    model.save_pretrained(str(tmp), state_dict=saved["model"])
    torch.save(saved["optimizer"], tmp / "optimizer.pt")
    if "scheduler" in saved:
        torch.save(saved["scheduler"], tmp / "scheduler.pt")
    (tmp / "trainer_state.json").write_text(saved["trainer_state"])
