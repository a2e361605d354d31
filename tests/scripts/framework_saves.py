"""A materialised flash save against the framework's own save of the same step (one process, CPU).

``python framework_saves.py <framework> <workdir>`` trains a GPT-2 built from a tiny config (its input and
output embeddings tied, as most language models' are) for two steps through the framework with mlaunch's
integration, then writes the same step twice: once with the framework's own save, once as mlaunch would
after a kill -9 — the integration's capture of the step, through the staging format (``shardfile``: the
bytes the agent persists), written by the integration's materialiser. It prints one JSON line:
``{"framework", "files": {name: "same" | "differs" | "missing" | "extra"}, "loads": bool, "error"}`` —
``loads`` says whether the framework's own load accepts the materialised checkpoint (Accelerate's
``load_state`` refused a file holding both tied names: "Unexpected key(s) in state_dict").

Files the framework writes deterministically are compared byte for byte; the test names the ones that
legitimately differ (a timestamp) and checks what they hold instead.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch

from launchers.elastic.format import shardfile


def tiny_gpt2() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=16, tie_word_embeddings=True)
    model = GPT2LMHeadModel(config)
    assert model.lm_head.weight is model.transformer.wte.weight, "the embeddings are not tied"
    return model


def batch(step: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 97, (4, 16), generator=torch.Generator().manual_seed(step))
    return {"input_ids": ids, "labels": ids}


def through_staging(state: Any, where: Path) -> Any:
    """``state`` as the restarted rank reads it back: encoded as staging does, persisted, read."""
    path = where / "shard.mlck"
    shardfile.write_file(path, shardfile.encode(state, {"step": 0}, trusted=True))
    return shardfile.read_file(path, trusted=True)[0]


def compare(native: Path, materialised: Path, only: list[str] | None = None) -> dict[str, str]:
    names = {p.relative_to(native) for p in native.rglob("*") if p.is_file() and (only is None or p.name in only)}
    ours = {p.relative_to(materialised) for p in materialised.rglob("*") if p.is_file()}
    verdict = {}
    for name in sorted(names | ours, key=str):
        if name not in ours:
            verdict[str(name)] = "missing"
        elif name not in names:
            verdict[str(name)] = "extra"
        else:
            same = (native / name).read_bytes() == (materialised / name).read_bytes()
            verdict[str(name)] = "same" if same else "differs"
    return verdict


def accelerate(work: Path) -> dict[str, Any]:
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    from launchers.elastic.integrations.accelerate import MlaunchAccelerate

    project = ProjectConfiguration(project_dir=str(work / "acc"), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=project)
    model = tiny_gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.9)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    mlaunch = MlaunchAccelerate(accelerator, model=model)
    for step in (1, 2):
        accelerator.backward(model(**batch(step)).loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        mlaunch.step = step
    saved = through_staging(mlaunch._capture(2), work)
    native = Path(accelerator.save_state())  # checkpoint_0
    materialised = work / "materialised"
    materialised.mkdir()
    mlaunch._write(materialised, saved)
    result: dict[str, Any] = {"files": compare(native, materialised)}
    before = {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    accelerator.load_state(str(materialised))
    plain = accelerator.unwrap_model(model)
    result["loads"] = all(torch.equal(before[k], v) for k, v in plain.state_dict().items())
    result["tied"] = plain.lm_head.weight is plain.transformer.wte.weight
    return result


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i % 4] for k, v in batch(i).items()}


def transformers(work: Path) -> dict[str, Any]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from launchers.elastic.integrations import transformers as integration

    captured: dict[str, Any] = {}

    class Capture(TrainerCallback):  # type: ignore[misc]
        """At step 2, what the integration stages under mlaunch (the Trainer then saves checkpoint-2)."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == 2:
                captured.update(integration._capture(args, state, control, kw, callback._flos()))

    training = TrainingArguments(
        output_dir=str(work / "hf"),
        max_steps=2,
        save_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        seed=0,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
    )
    model = tiny_gpt2()
    callback = integration.MlaunchCallback()
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(), callbacks=[callback, Capture()])
    trainer.train()
    saved = through_staging(captured, work)
    # what on_init_end does with every rank's staged state of the step (one rank here)
    saved["trainer_state"] = integration._with_flos(saved["trainer_state"], [saved["flos"]])
    materialised = work / "materialised"
    materialised.mkdir()
    integration._write(materialised, saved, model, training)
    result: dict[str, Any] = {"files": compare(work / "hf" / "checkpoint-2", materialised)}
    again = Trainer(model=tiny_gpt2(), args=training, train_dataset=Tokens())
    again._load_from_checkpoint(str(materialised))
    theirs = again.model.state_dict()
    result["loads"] = all(torch.equal(v, theirs[k]) for k, v in model.state_dict().items())
    result["tied"] = again.model.lm_head.weight is again.model.transformer.wte.weight
    return result


def lightning(work: Path) -> dict[str, Any]:
    import lightning as L
    from lightning.pytorch.plugins.environments import LightningEnvironment

    from launchers.elastic.integrations import lightning as integration

    class LM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.gpt = tiny_gpt2()

        def training_step(self, data: dict[str, torch.Tensor], i: int) -> torch.Tensor:
            return self.gpt(**data).loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    captured: dict[str, Any] = {}
    native = work / "native" / "last.ckpt"

    class Capture(L.Callback):
        """At step 2, what the integration stages under mlaunch, then Lightning's own save of that step."""

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, data: Any, i: int) -> None:
            if trainer.global_step == 2:
                captured.update(callback._capture(trainer, 2))
                trainer.save_checkpoint(native)

    callback = integration.MlaunchCallback()
    module = LM()
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=4)
    trainer = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback, Capture()],
        default_root_dir=str(work),
        plugins=[LightningEnvironment()],  # no detection: mpi4py is installed without an MPI library
    )
    trainer.fit(module, loader)
    saved = through_staging(captured, work)
    ours = integration.last_checkpoint([saved], callback.state_key)
    theirs = torch.load(native, weights_only=False)
    materialised = work / "materialised"
    materialised.mkdir()
    integration.save(ours, materialised / native.name)
    result: dict[str, Any] = {"files": compare(native.parent, materialised, [native.name])}
    ours = torch.load(materialised / native.name, weights_only=False)
    result["same_tree"] = same_tree(theirs, ours)
    weights = ours["state_dict"]
    result["tied"] = weights["gpt.lm_head.weight"].data_ptr() == weights["gpt.transformer.wte.weight"].data_ptr()
    again = LM()
    again.load_state_dict(weights)
    result["loads"] = all(torch.equal(v, weights[k]) for k, v in again.state_dict().items())
    return result


def same_tree(a: Any, b: Any, where: str = "") -> bool:
    """Equal values and types, tensors bit for bit (the file's bytes carry pickle's memo of each run)."""
    if isinstance(a, torch.Tensor):
        same = isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        same = isinstance(b, dict) and list(a) == list(b) and all(same_tree(a[k], b[k], f"{where}/{k}") for k in a)
    elif isinstance(a, (list, tuple)):
        same = (
            type(a) is type(b) and len(a) == len(b) and all(same_tree(x, y, where) for x, y in zip(a, b, strict=True))
        )
    elif type(a).__module__ == "numpy":
        import numpy as np

        same = type(a) is type(b) and np.array_equal(a, b)
    elif hasattr(a, "__dict__") and not callable(a):  # an object (DeepSpeed's LossScaler): its attributes
        same = type(a) is type(b) and same_tree(vars(a), vars(b), f"{where}.__dict__")
    else:
        same = type(a) is type(b) and a == b
    if not same:
        shown = (list(a), list(b)) if isinstance(a, dict) and isinstance(b, dict) else (str(a)[:200], str(b)[:200])
        print(f"differs at {where or '/'}: {shown[0]} != {shown[1]}", file=sys.stderr)
    return same


def deepspeed(work: Path) -> dict[str, Any]:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed as ds

    from launchers.elastic.integrations import deepspeed as integration

    ds.init_distributed(dist_backend="gloo")
    stage = int(os.environ.get("ZERO_STAGE", "2"))

    def engine_of(model: Any) -> Any:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        config = {
            "train_micro_batch_size_per_gpu": 4,
            # under ZeRO-3, LayerNorms and biases stay gathered (persistent), the weights are partitioned
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 100},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9,
        }
        return ds.initialize(model=model, optimizer=optimizer, config=config)[0]

    engine = engine_of(tiny_gpt2())
    mlaunch = integration.MlaunchDeepSpeed(engine, work / "native")
    for step in (1, 2):
        engine.backward(engine(**batch(step)).loss)
        engine.step()
    saved = through_staging(mlaunch._capture(2), work)
    before = full_state(engine)
    mlaunch.save()
    materialised = work / "materialised"
    materialised.mkdir()
    integration.write_files(materialised, 2, saved, integration.client_state([saved], saved))
    native = work / "native" / "global_step2"
    result: dict[str, Any] = {"files": compare(native, materialised)}
    for name, verdict in result["files"].items():
        if verdict == "differs":  # the same values and structure? (then only pickle's memo differs)
            same = same_tree(
                torch.load(native / name, weights_only=False), torch.load(materialised / name, weights_only=False)
            )
            result["files"][name] = "same values" if same else "differs"
    states = torch.load(next(materialised.glob("*model_states.pt")), weights_only=False)
    if stage == 3:  # the parameters are in the optimizer's partitions: DeepSpeed records the tie by name
        result["tied"] = states["shared_params"] == {"lm_head.weight": "transformer.wte.weight"}
    else:
        module = states["module"]
        result["tied"] = module["lm_head.weight"].data_ptr() == module["transformer.wte.weight"].data_ptr()
    (work / "native" / "latest").write_text("global_step2")
    native.rename(work / "own")  # kept beside, for a look when a file differs
    materialised.rename(native)  # the framework's own load, of the materialised copy
    fresh = tiny_gpt2()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    other = engine_of(fresh)  # ZeRO-3 loads into a pristine engine only (load_checkpoint's docstring)
    other.load_checkpoint(str(work / "native"), "global_step2")
    after = full_state(other)
    result["loads"] = before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    return result


def full_state(engine: Any) -> dict[str, torch.Tensor]:
    """The module's state with every parameter whole (ZeRO-3 gathers its partitions: every rank calls this)."""
    import deepspeed as ds

    with ds.zero.GatheredParameters(list(engine.module.parameters())):
        return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}


FRAMEWORKS = {"accelerate": accelerate, "transformers": transformers, "lightning": lightning, "deepspeed": deepspeed}


def main() -> None:
    framework, work = sys.argv[1], Path(sys.argv[2])
    os.environ.pop("MLAUNCH_RUN_ID", None)  # one process, no mlaunch: capture and materialise by hand
    work.mkdir(parents=True, exist_ok=True)
    try:
        result = {"framework": framework, **FRAMEWORKS[framework](Path(tempfile.mkdtemp(dir=work)))}
    except Exception:  # noqa: BLE001 - the test shows it
        result = {"framework": framework, "error": traceback.format_exc()}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
