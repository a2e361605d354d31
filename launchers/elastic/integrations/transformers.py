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
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launchers.elastic.integrations._session import Session, rank_world, write_once
from launchers.elastic.integrations._structure import record, restore

__all__ = ["MlaunchCallback"]

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


class MlaunchCallback(TrainerCallback):
    """Nothing lost on SIGTERM or kill -9 under mlaunch, in the ``Trainer``'s own checkpoint format."""

    def __init__(self) -> None:
        self.session = Session()
        self.resumed_from: int | None = None  # the step materialised from mlaunch's commit, if any
        self._trainer: Callable[[], Any] = lambda: None  # a weak reference to the Trainer that called on_init_end

    # -- start: mlaunch's commit as checkpoint-N ---------------------------------------
    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self.session.install()
        self._trainer = _calling_trainer()
        output = Path(args.output_dir)
        got = self.session.newer_commit(newest_complete(output))
        if got is None:
            return
        step, saved = got
        if "trainer_state" in saved:
            flos = [s.get("flos") for s in self.session.every_rank(step, saved)]
            saved["trainer_state"] = _with_flos(saved["trainer_state"], flos)
        model = kw.get("model")
        write = lambda tmp: _write(tmp, saved, model, args)  # noqa: E731
        write_once(output / f"checkpoint-{step}", step, write, every_rank=True)
        self.resumed_from = step

    # -- each step: stage, then agree on a stop ----------------------------------------
    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        step = state.global_step
        if self.session.wants_stage():
            self.session.stage_built(step, lambda: _capture(args, state, control, kw, self._flos()))
        if self.session.should_stop(step):
            control.should_save = True  # the Trainer writes checkpoint-N, then calls on_save
            control.should_training_stop = True

    def _flos(self) -> float | None:
        """This rank's floating point operations since the Trainer last added them to ``total_flos``."""
        flos = getattr(self._trainer(), "current_flos", None)
        return float(flos) if flos is not None else None

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


def _capture(
    args: TrainingArguments, state: TrainerState, control: TrainerControl, kw: dict[str, Any], flos: float | None
) -> Any:
    """This rank's part of ``checkpoint-<step>``: references to the tensors (staging copies them)."""
    captured: dict[str, Any] = {"step": state.global_step, "rng": _rng_state(), "flos": flos}
    if args.should_save:  # the process that writes the shared files of a checkpoint
        as_json = dataclasses.asdict(state)
        as_json.setdefault("stateful_callbacks", {})["TrainerControl"] = control.state()
        captured["model"] = kw["model"].state_dict()
        captured["optimizer"] = kw["optimizer"].state_dict()
        scheduler = kw.get("lr_scheduler")
        if scheduler is not None:
            captured["scheduler"] = scheduler.state_dict()
        captured["trainer_state"] = json.dumps(as_json, indent=2, sort_keys=True) + "\n"
        captured["structure"] = record(captured["model"])  # tied embeddings: staging copies them apart
    return captured


def _calling_trainer() -> Callable[[], Any]:
    """A weak reference to the ``Trainer`` whose ``__init__`` is calling ``on_init_end`` (callbacks are not
    handed the trainer; its ``current_flos`` is what the Trainer adds to ``total_flos`` when it saves)."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and hasattr(owner, "current_flos") and hasattr(owner, "callback_handler"):
            return weakref.ref(owner)
        frame = frame.f_back  # type: ignore[assignment]
    return lambda: None


def _with_flos(trainer_state: str, flos: list[float | None]) -> str:
    """``trainer_state.json`` as the Trainer's save writes it: ``store_flos`` first adds every rank's
    ``current_flos`` to ``total_flos`` (unchanged when a rank's figure is unknown)."""
    if any(f is None for f in flos):
        return trainer_state
    as_json = json.loads(trainer_state)
    as_json["total_flos"] += sum(f for f in flos if f is not None)
    return json.dumps(as_json, indent=2, sort_keys=True) + "\n"


def _write(tmp: Path, saved: dict[str, Any], model: Any, args: TrainingArguments) -> None:
    """Write this rank's files of the native checkpoint into ``tmp`` (``trainer_state.json`` last)."""
    rank, world = rank_world()
    # interned keys, as the Trainer's literals are: pickle then shares the "cpu" key with the tensor's
    # location string, and the file is byte for byte the Trainer's
    rng = {sys.intern(key): value for key, value in saved["rng"].items()}
    version, internal, gauss = rng["python"]
    rng["python"] = (version, tuple(internal), gauss)
    rng["numpy"] = tuple(rng["numpy"])
    torch.save(rng, tmp / ("rng_state.pth" if world <= 1 else f"rng_state_{rank}.pth"))
    if "model" not in saved:
        return
    # tied weights shared again, so save_pretrained keeps the one name it keeps for the live model
    model.save_pretrained(str(tmp), state_dict=restore(saved["model"], saved.get("structure")))
    torch.save(args, tmp / "training_args.bin")  # as the Trainer's save_model writes it
    torch.save(saved["optimizer"], tmp / "optimizer.pt")
    if "scheduler" in saved:
        torch.save(saved["scheduler"], tmp / "scheduler.pt")
    (tmp / "trainer_state.json").write_text(saved["trainer_state"])
