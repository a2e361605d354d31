"""ParameterServerStrategy: a chief drives training, ps hold the variables, workers run steps.

ps and worker tasks only serve (``tf.distribute.Server.join()`` never returns), so mlaunch
treats them as services: the chief decides the job's outcome and mlaunch stops the servers
once it has exited 0. The chief schedules STEPS steps that each add 1 to every weight on the
ps, then prints ``final-weights``: exactly STEPS everywhere when every step ran once.
"""

import hashlib
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

STEPS = 40


def serve(task: dict) -> None:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=task["type"], task_index=task["index"], protocol="grpc", start=True
    )
    print(f"{task['type']} {task['index']} serving at {server.target}", flush=True)
    server.join()


def drive() -> None:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w = tf.Variable(tf.zeros([4]), name="w")

    @tf.function
    def step():
        def replica_fn():
            w.assign_add(tf.ones([4]))
            return tf.reduce_sum(w)

        return strategy.run(replica_fn)

    for _ in range(STEPS):
        coordinator.schedule(step)
    coordinator.join()
    weights = w.numpy()
    digest = hashlib.sha256(weights.round(5).tobytes()).hexdigest()[:16]
    print(f"chief: {STEPS} steps on {strategy._num_workers} workers; w lives on {w.device}", flush=True)
    print(f"final-weights {digest} {weights.tolist()}", flush=True)


if __name__ == "__main__":
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    if task["type"] == "chief":
        drive()
    else:
        serve(task)
