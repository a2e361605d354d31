"""FAKE ``taskd.api``: the names MindCluster's TaskD exports (component/taskd/taskd/api/__init__.py)."""

from taskd.api.taskd_manager_api import init_taskd_manager, start_taskd_manager
from taskd.api.taskd_worker_api import destroy_taskd_worker, init_taskd_worker, start_taskd_worker

__all__ = [
    "destroy_taskd_worker",
    "init_taskd_manager",
    "init_taskd_worker",
    "start_taskd_manager",
    "start_taskd_worker",
]
