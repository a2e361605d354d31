"""Executing a LaunchPlan: supervision of one attempt and the restart loop around it.

Supervision: ``supervisor`` (its loop), ``streams``, ``teardown``, ``signal_router``, ``watchdog``,
``hang``, ``labels`` and ``taskd_manager`` (a side process beside the ranks). The restart loop:
``runner`` (one run), ``restarts`` (the one loop, with ``membership`` for elastic jobs),
``attempt``, ``retry_policy``, ``job_wide`` and ``job_event_response``. What they serve or use
lives in its own room: planning (``launchers.planning``, ``preflight``, ``rank_env``), the
agent half of checkpointing (``launchers.persist``), the standbys (``launchers.standby``) and
observation (``launchers.observe``); ``tests/test_layout.py`` keeps it so.
"""
