"""MindSpore data-parallel training on CPU, for the ascend engine's msrun (dynamic cluster) style.

mlaunch starts one scheduler (MS_ROLE=MS_SCHED) and the workers (MS_ROLE=MS_WORKER) with the
same MS_* env msrun would export; ``init()`` joins them. Each worker trains a small dense
layer on its own deterministic shard, gradients averaged across workers (DATA_PARALLEL,
gradients_mean), and prints ``final-weights <checksum>``: identical on every worker when the
all-reduce worked. The scheduler's ``init()`` serves the cluster and returns when it ends.
"""

import hashlib
import os

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.communication import get_group_size, get_rank, init

STEPS = 20


def main() -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    init()
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return
    rank, size = get_rank(), get_group_size()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    ms.set_seed(0)
    net = nn.Dense(4, 1, weight_init="zeros", bias_init="zeros")
    loss_fn = nn.MSELoss()
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.1)
    train = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer)
    train.set_train()
    rng = np.random.default_rng(1234 + rank)  # each worker its own shard
    x = rng.normal(size=(32, 4)).astype(np.float32)
    y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype=np.float32)
    first = last = None
    for _ in range(STEPS):
        last = float(train(ms.Tensor(x), ms.Tensor(y)).asnumpy())
        first = last if first is None else first
    total = ops.AllReduce()(ms.Tensor(np.array([rank + 1.0], dtype=np.float32))).asnumpy()[0]
    weights = np.concatenate([p.asnumpy().ravel() for p in net.trainable_params()]).round(5)
    digest = hashlib.sha256(weights.tobytes()).hexdigest()[:16]
    print(f"rank {rank} of {size}: loss {first:.4f} -> {last:.6f}; allreduce sum {total:g}", flush=True)
    print(f"final-weights {digest} {weights.tolist()}", flush=True)


if __name__ == "__main__":
    main()
