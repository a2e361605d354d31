"""DeepSpeed: ``mlaunch = MlaunchDeepSpeed(engine, save_dir)`` around ``save_checkpoint``/``load_checkpoint``.

::

    from launchers.elastic.integrations.deepspeed import MlaunchDeepSpeed

    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    mlaunch = MlaunchDeepSpeed(engine, "output/ds", data=loader)   # data: optional, a ResumableLoader
    step = mlaunch.resume()             # engine.load_checkpoint of the newest step ('latest'); 0 when none
    while step < max_steps:
        loss = engine(batch); engine.backward(loss); engine.step()
        step = engine.global_steps
        mlaunch.step_end(step)          # stage it; on SIGTERM: save_checkpoint on every rank, exit 143
        if step % save_every == 0:
            mlaunch.save()              # engine.save_checkpoint(save_dir, "global_step<N>", client_state)
    mlaunch.finish()

What the helper does:

- **SIGTERM**: the signal only sets mlaunch's flag; ``step_end`` checks it on every rank (one
  all-reduce), so all ranks stop at the same step: ``engine.save_checkpoint`` writes it in DeepSpeed's
  own layout (``<save_dir>/global_step<N>/``, then ``latest``), and every rank leaves with 143.
- **kill -9 / crash**: ``step_end`` stages the dictionaries ``save_checkpoint`` would write for this
  rank (DeepSpeed's own ``_save_checkpoint`` builds them: the model states file on data-parallel rank
  0, with the optimizer below ZeRO; each rank's ZeRO optimizer partition from stage 1 on; under ZeRO-3
  every rank's own model states file, each partitioned parameter the empty placeholder ``save_checkpoint``
  writes, without its partition/all-gather) and its RNG state, in shared memory; mlaunch commits the newest
  step every rank staged. ``resume()`` writes that step as ``<save_dir>/global_step<N>/`` with ``latest``
  pointing at it when it is newer than the tag ``latest`` names, then loads it with ``engine.load_checkpoint``.
- **RNG and data**: DeepSpeed saves no RNG state; the helper's saves put every rank's RNG state (and
  ``data``'s ``state_dict``) into the checkpoint's ``client_state`` under ``"mlaunch"``, and ``resume``
  puts them back.

The staged copy is pickled (``Checkpointer(trusted=True)``): DeepSpeed's checkpoint holds objects, not
only plain data (its ``DeepSpeedConfig``; the ZeRO optimizer's ``LossScaler``), and DeepSpeed loads its
own files with ``weights_only=False`` anyway. Keep ``checkpoint.dir`` writable by you alone, as
``save_dir`` already must be.

Limits: ZeRO stages 0–3; no tensor parallelism; pipeline parallelism, MoE layers and NVMe offload are refused
when the helper is built (``NotImplementedError``: their state is in files the staging does not capture);
``save_checkpoint`` calls outside the helper (``engine.save_checkpoint`` directly) carry no RNG state.
"""

from __future__ import annotations

import logging
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from launchers.elastic.integrations._session import Session, barrier, rank_world, write_once
from launchers.elastic.integrations._structure import record, restore

__all__ = ["MlaunchDeepSpeed"]

_TAG = re.compile(r"^global_step(\d+)$")


class _Capture:
    """A checkpoint engine that keeps what DeepSpeed asks it to save (relative path → state dict)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[str, Any] = {}

    def save(self, state_dict: Any, path: str) -> None:
        self.files[os.path.relpath(path, self.root)] = state_dict

    def __getattr__(self, name: str) -> Any:  # create, commit, makedirs...: nothing to do
        return lambda *args, **kwargs: True


class MlaunchDeepSpeed:
    """Nothing lost on SIGTERM or kill -9 under mlaunch, in DeepSpeed's own checkpoint format."""

    def __init__(self, engine: Any, save_dir: str | Path, *, data: Any = None) -> None:
        refuse_unsupported(engine)
        self.engine = engine
        self.save_dir = Path(save_dir)
        self.data = data  # saved and restored through client_state (e.g. a ResumableLoader)
        self.session = Session(trusted=True)
        self.session.install()
        self.resumed_from: int | None = None  # the step materialised from mlaunch's commit, if any

    # -- where DeepSpeed's checkpoints are ---------------------------------------------
    def newest(self) -> tuple[str, int] | None:
        """(tag, step) of the checkpoint ``latest`` names (DeepSpeed writes it last), if any."""
        latest = self.save_dir / "latest"
        if not latest.is_file():
            return None
        tag = latest.read_text().strip()
        m = _TAG.match(tag)
        if m:
            return tag, int(m.group(1))
        try:  # a tag of the user's own: the step is in the model states file (zero_pp_rank_0_... under ZeRO-3)
            name = min(p.name for p in (self.save_dir / tag).glob("*mp_rank_00_model_states.pt"))
            states = torch.load(self.save_dir / tag / name, weights_only=False, mmap=True)
            return tag, int(states["global_steps"])
        except Exception:  # noqa: BLE001 - unreadable: mlaunch's commit, if any, is better
            return None

    # -- start -------------------------------------------------------------------------
    def resume(self) -> int:
        """Load the newest step (mlaunch's commit, written as DeepSpeed's, when it is newer) through
        ``engine.load_checkpoint``; returns ``engine.global_steps`` (0 when nothing). Every rank."""
        native = self.newest()
        got = self.session.newer_commit(native[1] if native else None)
        if got is not None:
            step, saved = got
            tag = f"global_step{step}"
            write_once(self.save_dir / tag, step, lambda tmp: self._write(tmp, step, saved), every_rank=True)
            if rank_world()[0] == 0:
                _write_text(self.save_dir / "latest", tag)
            barrier()
            self.resumed_from = step
            native = (tag, step)
        if native is None:
            return 0
        _path, client = self.engine.load_checkpoint(str(self.save_dir), native[0])
        own = (client or {}).get("mlaunch", {})
        rng = own.get("rng", {}).get(str(rank_world()[0]))
        if rng is not None:
            _set_rng_state(rng)
        if self.data is not None and own.get("data") is not None:
            self.data.load_state_dict(own["data"])
        return int(self.engine.global_steps)

    def _write(self, tmp: Path, step: int, saved: dict[str, Any]) -> None:
        """This rank's files of ``global_step<N>/`` from what it staged, with every rank's RNG state in its model
        states file (as ``save()`` writes it: under ZeRO-3 every rank loads its own ``zero_pp_rank_<r>`` file)."""
        write_files(tmp, step, saved, client_state(_every_rank({"rng": saved["rng"]}), saved))

    # -- each step ---------------------------------------------------------------------
    def step_end(self, step: int) -> None:
        """After optimizer step ``step`` on every rank: stage it; on a stop, save it and exit 143."""
        if self.session.wants_stage():
            self.session.stage_built(step, lambda: self._capture(step))
        if self.session.should_stop(step):
            self.save()
            self.session.stop()

    def save(self) -> Path:
        """``engine.save_checkpoint`` of the current step with every rank's RNG state (every rank)."""
        every = _every_rank(_rng_state())
        client = {"rng": {str(r): s for r, s in enumerate(every)}, "data": self._data_state()}
        tag = f"global_step{self.engine.global_steps}"
        self.engine.save_checkpoint(str(self.save_dir), tag, client_state={"mlaunch": client})
        return self.save_dir / tag

    def finish(self) -> None:
        """Training completed: tell mlaunch (nothing staged is persisted any more); ends the group at exit."""
        self.session.finished()

    def _capture(self, step: int) -> dict[str, Any]:
        """What ``save_checkpoint`` would write for this rank, built by DeepSpeed's own code."""
        engine = self.engine
        tag = f"global_step{step}"
        capture = _Capture(self.save_dir)
        original = engine.checkpoint_engine
        engine.checkpoint_engine = capture
        quiet = logging.getLogger("DeepSpeed")  # its "Saving model checkpoint" line, once per step otherwise
        level = quiet.level
        quiet.setLevel(logging.WARNING)
        try:
            if engine.save_non_zero_checkpoint:  # every rank under ZeRO-3 (its own zero_pp_rank_<r> file)
                with _partitioned_module_state(engine):
                    engine._save_checkpoint(str(self.save_dir), tag, client_state={})
            if engine.save_zero_checkpoint:  # _save_zero_checkpoint, without its copy of zero_to_fp32.py
                from deepspeed.git_version_info import version

                state = dict(optimizer_state_dict=engine.optimizer.state_dict(), ds_config=engine.config)
                capture.save({**state, "ds_version": version}, engine._get_zero_ckpt_name(str(self.save_dir), tag))
        finally:
            engine.checkpoint_engine = original
            quiet.setLevel(level)
        files = capture.files
        return {
            "step": step,
            "files": files,
            "structure": record(files),
            "rng": _rng_state(),
            "data": self._data_state(),
        }

    def _data_state(self) -> Any:
        return self.data.state_dict() if self.data is not None else None


def refuse_unsupported(engine: Any) -> None:
    """Raise for what the helper cannot save whole: its staged copy would be missing state, silently."""
    from deepspeed.runtime.pipe.engine import PipelineEngine

    unsupported = {
        "pipeline parallelism (PipelineEngine: its layers save their own files)": isinstance(engine, PipelineEngine),
        "MoE layers (their experts save their own files)": bool(getattr(engine, "has_moe_layers", False)),
        "NVMe offload (the optimizer's state lives in the swap files)": _nvme(engine),
    }
    found = [what for what, yes in unsupported.items() if yes]
    if found:
        limits = "see docs/trainers-deepspeed.md"
        raise NotImplementedError(f"MlaunchDeepSpeed cannot flash-save {', '.join(found)}; {limits}")


def _nvme(engine: Any) -> bool:
    try:
        offload_param = engine.zero_offload_param()
        on_nvme = offload_param is not None and str(getattr(offload_param, "device", "")).endswith("nvme")
        return bool(engine.zero_nvme_offload_optimizer()) or on_nvme
    except AttributeError:
        return False


class _partitioned_module_state:  # noqa: N801 - used as a context manager, like torch.no_grad
    """``engine.module_state_dict`` as ``save_checkpoint`` sees it under ZeRO-3, without partitioning anything.

    ``save_checkpoint`` first partitions every parameter (``checkpoint_event_prologue``: each ZeRO-3 parameter's
    ``data`` becomes an empty tensor, the values live in the optimizer's flat fp32 partitions, saved in the
    ``optim_states`` files), writes, then gathers the persistent ones again (``checkpoint_event_epilogue``: an
    all-gather). Staging runs every step and must not communicate: this puts the empty tensor the partitioned
    parameter would hold in place of each ZeRO-3 parameter (one per parameter: tied names share it) in the
    state dict, and leaves the live parameters as they are. Below ZeRO-3 nothing changes.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.active = bool(engine.zero_optimization_partition_weights())

    def __enter__(self) -> None:
        if not self.active:
            return
        engine = self.engine
        original = engine.module_state_dict

        def module_state_dict(*args: Any, **kwargs: Any) -> Any:
            state = original(*args, **kwargs)
            prefix = kwargs.get("prefix", "")
            placeholders: dict[int, torch.Tensor] = {}
            for name, param in engine.module.named_parameters(prefix=prefix, remove_duplicate=False):
                if name in state and hasattr(param, "ds_id"):
                    empty = torch.empty(0, dtype=param.dtype, device=param.device)
                    state[name] = placeholders.setdefault(id(param), empty)
            return state

        engine.module_state_dict = module_state_dict  # an instance attribute: the class's method is untouched

    def __exit__(self, *exc: object) -> None:
        if self.active:
            vars(self.engine).pop("module_state_dict", None)


def _every_rank(own: Any) -> list[Any]:
    """``own`` of every rank, by rank (an all-gather; ``[own]`` without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [own]
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, own)
    return every


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".mlaunch-tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state()}
    state["torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(tuple(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def client_state(every: list[dict[str, Any]], own: dict[str, Any]) -> dict[str, Any]:
    """The ``client_state["mlaunch"]`` the helper's ``save`` writes, from every rank's staged state."""
    return {"rng": {str(rank): state["rng"] for rank, state in enumerate(every)}, "data": own.get("data")}


def write_files(tmp: Path, step: int, saved: dict[str, Any], client: dict[str, Any]) -> None:
    """This rank's files of ``global_step<step>/`` into ``tmp``, as DeepSpeed's ``save_checkpoint`` writes them:
    what staging lost put back, the model states file with the ``client`` state (on the rank that has it)."""
    files = restore(saved["files"], saved.get("structure"))
    for name, state in files.items():
        if name.endswith("model_states.pt"):
            state.update({"mlaunch": client})  # as save_checkpoint's state.update(client_state)
        target = tmp / Path(name).relative_to(f"global_step{step}")
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, target)
