"""MindSpore data-parallel training with mlaunch's ExceptionCheckpoint callback (slow MindSpore suite).

Env: CKPT_DIR; SIGNAL_RANK/SIGNAL_STEP (that rank sends itself SIGTERM at that step end);
STEPS (dataset size in steps, default 40). Prints ``resumed <step>`` when it loads a
checkpoint, ``stopped`` never (the callback exits 143), ``done <checksum>`` at the end.
"""

from __future__ import annotations

import hashlib
import os
import signal

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.communication import get_rank, init
from mindspore.train import Callback, Model

from launchers.elastic.mindspore import ExceptionCheckpoint


class SignalAt(Callback):  # type: ignore[misc]
    def __init__(self, rank: int, step: int) -> None:
        super().__init__()
        self.rank, self.step = rank, step

    def on_train_step_end(self, run_context):  # type: ignore[no-untyped-def]
        if get_rank() == self.rank and int(run_context.original_args().cur_step_num) == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    init()
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return
    rank = get_rank()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    ms.set_seed(0)
    net = nn.Dense(4, 1, weight_init="zeros", bias_init="zeros")
    ckpt_dir = os.environ["CKPT_DIR"]
    latest = ExceptionCheckpoint.latest(ckpt_dir)
    if latest is not None:
        params = ms.load_checkpoint(str(latest))
        step = int(params["step_num"].asnumpy()) if hasattr(params["step_num"], "asnumpy") else params["step_num"]
        ms.load_param_into_net(net, params)
        print(f"resumed {step} from {latest.name}", flush=True)
    rng = np.random.default_rng(1234 + rank)
    x = rng.normal(size=(int(os.environ.get("STEPS", "40")) * 8, 4)).astype(np.float32)
    y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype=np.float32)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(8)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05))
    callbacks: list[Callback] = []
    if os.environ.get("SIGNAL_RANK"):  # before the checkpoint callback: the stop is at this very step
        callbacks.append(SignalAt(int(os.environ["SIGNAL_RANK"]), int(os.environ.get("SIGNAL_STEP", "5"))))
    callbacks.append(ExceptionCheckpoint(prefix="dp", directory=ckpt_dir))
    model.train(1, data, callbacks=callbacks, dataset_sink_mode=False)
    weights = np.concatenate([p.asnumpy().ravel() for p in net.trainable_params()]).round(5)
    print(f"done {hashlib.sha256(weights.tobytes()).hexdigest()[:16]}", flush=True)


if __name__ == "__main__":
    main()
