"""Accelerate: ``mlaunch = MlaunchAccelerate(accelerator)`` around ``save_state``/``load_state``.

::

    from launchers.elastic.integrations.accelerate import MlaunchAccelerate

    project = ProjectConfiguration(project_dir="output/acc", automatic_checkpoint_naming=True)
    accelerator = Accelerator(project_config=project)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.register_for_checkpointing(loader)   # the data position (a ResumableLoader)
    mlaunch = MlaunchAccelerate(accelerator, model=model)  # or (accelerator, "output/acc", model=model)
    step = mlaunch.resume()                          # Accelerate's load_state of the newest step; 0 when none
    while step < max_steps:
        ... one optimizer step ...
        step += 1
        mlaunch.step_end(step)                       # stage it; on SIGTERM: save_state, exit 143
        if step % save_every == 0:
            mlaunch.save()                           # accelerator.save_state(), the step recorded
    mlaunch.finish()

What the helper does:

- **SIGTERM**: the signal only sets mlaunch's flag; ``step_end`` checks it on every rank (one
  all-reduce), so all ranks stop at the same step: ``accelerator.save_state`` writes that step in
  Accelerate's own format, then every rank leaves with 143.
- **kill -9 / crash**: ``step_end`` stages what ``save_state`` would write for this rank (the main
  process: models, optimizers, schedulers and the registered objects; every rank its RNG state and
  ``accelerator.step``) in shared memory; mlaunch commits the newest step every rank staged.
  ``resume()`` writes that step as a native checkpoint directory when it is newer than the newest
  complete one there, then loads it with ``accelerator.load_state``. Written with Accelerate's own ``save``
  from the staged copies, tied weights shared again (``_structure``): the directory holds the files, and bytes,
  ``save_state`` would have written of that step (a tied embedding once, under the name Accelerate keeps).
- **where**: with ``automatic_checkpoint_naming`` the checkpoints are Accelerate's
  ``<project_dir>/checkpoints/checkpoint_<i>`` (``resume`` also sets the next ``i``, which
  ``load_state`` does not); with ``output_dir`` they are ``<output_dir>/checkpoint_<step>``.
  The helper registers itself for checkpointing: the step and DDP's gradient bucket layout
  travel in the checkpoint as one more ``custom_checkpoint_<k>.pkl``.
- **bit for bit**: given the prepared ``model=`` (Accelerate's ``DistributedDataParallel``), the helper
  records the gradient bucket layout DDP rebuilt after its first step and starts the resumed DDP with it
  (``launchers.elastic.ddp_buckets``): with more than two ranks the resumed run then matches the
  uninterrupted one to the last bit, not only closely.

- **RNG**: ``load_state`` restores every rank's RNG state; the helper sets it again right before the
  model's first forward, after the loop made its iterator (``skip_first_batches`` of a plain shuffled
  ``DataLoader`` through ``prepare``: the iterator draws a seed from torch's global RNG, which the
  uninterrupted run drew at its epoch start), so dropout continues as in the uninterrupted run.

Limits: data-parallel training (DDP, or one process): FSDP and DeepSpeed inside Accelerate keep state
the main process cannot capture alone; ``sampler.bin`` and ``dl_state_dict.bin`` (an iterable dataset's
seedable sampler, a stateful dataloader) and the fp16 ``GradScaler`` are not staged: register a
``ResumableLoader`` or skip ``step`` batches with ``accelerator.skip_first_batches``. Registered objects'
states must be plain data (tensors, numbers, strings, lists, dicts) unless ``trusted=True``.
"""

from __future__ import annotations

import random
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from launchers.elastic import ddp_buckets
from launchers.elastic.integrations._session import Session, barrier, write_once
from launchers.elastic.integrations._structure import record, restore

__all__ = ["MlaunchAccelerate"]

_CHECKPOINT = re.compile(r"^checkpoint_(\d+)$")


class MlaunchAccelerate:
    """Nothing lost on SIGTERM or kill -9 under mlaunch, in Accelerate's own checkpoint format."""

    def __init__(
        self, accelerator: Any, output_dir: str | Path | None = None, *, model: Any = None, trusted: bool = False
    ) -> None:
        self.accelerator = accelerator
        self.model = model  # the prepared (DDP) model: its gradient bucket layout is saved and restored
        self.automatic = bool(accelerator.project_configuration.automatic_checkpoint_naming)
        if output_dir is None and not self.automatic:
            raise ValueError(
                "MlaunchAccelerate needs output_dir, or an Accelerator with "
                "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)"
            )
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.session = Session(trusted=trusted)
        self.session.install()
        self.step = 0  # the last finished step (saved in the checkpoint: this object is registered)
        self.resumed_from: int | None = None  # the step materialised from mlaunch's commit, if any
        self._buckets: list[list[int]] | None = None
        accelerator.register_for_checkpointing(self)
        self._index = len(accelerator._custom_objects) - 1  # our custom_checkpoint_<k>.pkl

    # -- registered with Accelerate ----------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "ddp_buckets": self._buckets}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self._buckets = state.get("ddp_buckets")

    # -- where Accelerate's checkpoints are --------------------------------------------
    @property
    def root(self) -> Path:
        """The directory holding the ``checkpoint_<n>`` directories."""
        if self.output_dir is not None:
            return self.output_dir
        return Path(self.accelerator.project_dir) / "checkpoints"

    def newest(self) -> tuple[int, Path, int] | None:
        """(n, directory, step) of the newest complete ``checkpoint_<n>``: our registered state and
        every rank's ``random_states_<r>.pkl`` are there."""
        world = self.accelerator.num_processes
        found = []
        for n, path in _numbered(self.root):
            own = path / f"custom_checkpoint_{self._index}.pkl"
            if own.is_file() and all((path / f"random_states_{r}.pkl").is_file() for r in range(world)):
                found.append((n, path))
        for n, path in sorted(found, reverse=True):
            try:
                step = int(torch.load(path / f"custom_checkpoint_{self._index}.pkl", weights_only=True)["step"])
            except Exception:  # noqa: BLE001 - a torn or foreign file: try an older checkpoint
                continue
            return n, path, step
        return None

    # -- start -------------------------------------------------------------------------
    def resume(self) -> int:
        """Load the newest step (mlaunch's commit, as a native checkpoint, when it is newer) through
        ``accelerator.load_state``; returns that step, 0 when there is nothing to resume. Every rank."""
        native = self.newest()
        got = self.session.newer_commit(native[2] if native else None)
        if got is not None:
            step, saved = got
            n = max((k for k, _ in _numbered(self.root)), default=-1) + 1 if self.automatic else step
            target = self.root / f"checkpoint_{n}"
            write_once(target, step, lambda tmp: self._write(tmp, saved), every_rank=True)
            native = (n, target, step)
            self.resumed_from = step
        if native is None:
            return 0
        n, path, _step = native
        self.accelerator.load_state(str(path))
        self._rng_at_first_forward()
        if self.automatic:
            self.accelerator.project_configuration.iteration = n + 1  # load_state leaves it at 0
        model = self._ddp()
        if self._buckets is not None and model is not None:
            ddp_buckets.set_layout(model, self._buckets)  # the resumed step reduces as before
        return self.step

    def _rng_at_first_forward(self) -> None:
        """Put the RNG state ``load_state`` restored back right before the model's first forward.

        Between ``resume()`` and that forward the loop makes its iterator (``skip_first_batches``, a new
        epoch): a ``DataLoader`` without its own ``generator=`` draws its workers' base seed from torch's
        global RNG there, which the uninterrupted run drew at its epoch start, before the saved step — so
        dropout would run one draw ahead of the uninterrupted run's.
        """
        models = [self.model] if self.model is not None else list(self.accelerator._models)
        if not models or not isinstance(models[0], torch.nn.Module):
            return
        state = (random.getstate(), np.random.get_state(), torch.get_rng_state())

        def before_forward(module: torch.nn.Module, _args: Any) -> None:
            handle.remove()
            random.setstate(state[0])
            np.random.set_state(state[1])
            torch.set_rng_state(state[2])

        handle = models[0].register_forward_pre_hook(before_forward)

    def _write(self, tmp: Path, saved: dict[str, Any]) -> None:
        """This rank's files of ``save_state``'s directory, from what it staged."""
        from accelerate.utils import save

        acc = self.accelerator
        restore(saved, saved.get("structure"))  # tied weights one tensor again, as save_state sees them
        rng = dict(saved["rng"])
        version, internal, gauss = rng["random_state"]
        rng["random_state"] = (version, tuple(internal), gauss)
        rng["numpy_random_seed"] = tuple(rng["numpy_random_seed"])
        torch.save(rng, tmp / f"random_states_{acc.process_index}.pkl")
        if "models" not in saved:
            return
        for i, state in enumerate(saved["models"]):
            state = OrderedDict(state)  # save() drops the duplicate names of a shared storage from an OrderedDict
            save(state, tmp / ("model.safetensors" if i == 0 else f"model_{i}.safetensors"), safe_serialization=True)
        for kind in ("optimizer", "scheduler"):
            for i, state in enumerate(saved[f"{kind}s"]):
                torch.save(state, tmp / (f"{kind}.bin" if i == 0 else f"{kind}_{i}.bin"))
        for i, state in enumerate(saved["custom"]):
            torch.save(state, tmp / f"custom_checkpoint_{i}.pkl")

    # -- each step ---------------------------------------------------------------------
    def step_end(self, step: int) -> None:
        """After optimizer step ``step`` on every rank: stage it; on a stop, save it and exit 143."""
        self.step = step
        model = self._ddp()
        if model is not None:
            self._buckets = ddp_buckets.layout(model) or self._buckets  # every rank: collective once
        if self.session.wants_stage():
            self.session.stage_built(step, lambda: self._capture(step))
        if self.session.should_stop(step):
            self.save()
            barrier()  # every rank's files of the checkpoint are written
            self.session.stop()

    def save(self) -> Path:
        """``accelerator.save_state`` of the current step (every rank); returns the directory."""
        if self.automatic:
            return Path(self.accelerator.save_state())
        return Path(self.accelerator.save_state(str(self.root / f"checkpoint_{self.step}")))

    def finish(self) -> None:
        """Training completed: tell mlaunch (nothing staged is persisted any more); ends the group at exit."""
        self.session.finished()

    def _capture(self, step: int) -> dict[str, Any]:
        """What ``save_state`` would write for this rank: references to the tensors (staging copies them)."""
        acc = self.accelerator
        state: dict[str, Any] = {"step": step, "rng": _rng_state(acc.step)}
        if acc.is_main_process:
            state["models"] = [acc.get_state_dict(m, unwrap=False) for m in acc._models]
            state["optimizers"] = [o.state_dict() for o in acc._optimizers]
            state["schedulers"] = [s.state_dict() for s in acc._schedulers]
            state["custom"] = [o.state_dict() for o in acc._custom_objects]
            state["structure"] = record(state)  # staging copies tied weights apart; _write ties them again
        return state

    def _ddp(self) -> DistributedDataParallel | None:
        return self.model if isinstance(self.model, DistributedDataParallel) else None  # Accelerate keeps it unwrapped


def _numbered(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    return [(int(m.group(1)), p) for p in root.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir()]


def _rng_state(accelerator_step: int) -> dict[str, Any]:
    """``random_states_<r>.pkl`` as ``save_state`` writes it (CPU, and CUDA when in use)."""
    state: dict[str, Any] = {
        "step": accelerator_step,
        "random_state": random.getstate(),
        "numpy_random_seed": np.random.get_state(),
        "torch_manual_seed": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda_manual_seed"] = torch.cuda.get_rng_state_all()
    return state
