"""MultiWorkerMirroredStrategy with a custom training loop (Keras 3 ``fit`` fails under MWMS).

Every worker reads its place from TF_CONFIG (mlaunch sets it), trains a small linear model on
its own deterministic shard with gradients all-reduced across workers, and prints
``final-weights <checksum>``: identical on every worker when the all-reduce worked.
"""

import hashlib
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

STEPS = 30
TRUE_W = np.array([[1.0], [-2.0], [0.5], [3.0]], dtype=np.float32)


def main() -> None:
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(1234 + task["index"])  # each worker its own shard
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = x @ TRUE_W
    with strategy.scope():
        w = tf.Variable(tf.zeros([4, 1]), name="w")

    @tf.function
    def step(x, y):
        def replica_fn(x, y):
            ctx = tf.distribute.get_replica_context()
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
            grad = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, tape.gradient(loss, w))
            w.assign_sub(0.1 * grad)
            return ctx.all_reduce(tf.distribute.ReduceOp.MEAN, loss)

        return strategy.run(replica_fn, args=(x, y))

    first = last = None
    for _ in range(STEPS):
        loss = float(step(tf.constant(x), tf.constant(y)))
        first = loss if first is None else first
        last = loss
    weights = w.numpy().round(5)
    digest = hashlib.sha256(weights.tobytes()).hexdigest()[:16]
    print(f"worker {task['index']} of {strategy.num_replicas_in_sync}: loss {first:.4f} -> {last:.6f}", flush=True)
    print(f"final-weights {digest} {weights.ravel().tolist()}", flush=True)


if __name__ == "__main__":
    main()
