"""One line of integration per trainer: nothing lost on a preemption (SIGTERM) or a crash (kill -9).

- ``launchers.elastic.integrations.transformers``: ``Trainer(..., callbacks=[MlaunchCallback()])``
- ``launchers.elastic.integrations.lightning``: ``L.Trainer(..., callbacks=[MlaunchCallback(),
  ModelCheckpoint(save_last=True)])``
- ``launchers.elastic.integrations.accelerate``: ``mlaunch = MlaunchAccelerate(accelerator, model=model)``, then
  ``mlaunch.resume()``, ``mlaunch.step_end(step)`` and ``mlaunch.finish()`` around Accelerate's ``save_state``
- ``launchers.elastic.integrations.deepspeed``: ``mlaunch = MlaunchDeepSpeed(engine, save_dir)``, then the same
  three calls around DeepSpeed's ``save_checkpoint``/``load_checkpoint``

Each integration, in the framework's own terms:

- **SIGTERM**: the signal only sets mlaunch's flag; every rank checks it at the same step end (one
  all-reduce) and every rank stops at that step, saved through the framework's own checkpoint format,
  then leaves with 143 (``launchers.elastic.guard``).
- **kill -9 / crash**: each step's state is staged in shared memory (``Checkpointer.stage``); mlaunch
  commits the newest step every rank staged. On the restart, before the framework looks for its
  checkpoints, the integration writes that step as a native checkpoint when it is newer than the
  framework's own newest one, so the framework's own resume path finds it.
- **Finish**: the process group is ended before the interpreter exits, and the rank tells mlaunch it
  finished, so an abort in interpreter teardown does not turn a finished job into a failure.

Importing this package imports no framework; each module imports its framework when it is imported.
"""
