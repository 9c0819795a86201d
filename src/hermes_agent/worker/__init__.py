"""Scale-out on Celery workers: durable runs that survive a killed worker, exactly-once tool
calls, one turn of a session at a time across machines (docs/scale-out.md).

Needs the ``worker`` extra (Celery, with Redis or RabbitMQ as the broker) and a SQL store for
the runs' state (PostgreSQL when workers run on several machines). A public module: import from
here, not from its submodules (docs/api.md).
"""

from hermes_agent.worker.client import QueueClient, RunHandle, result_from_dict, submit
from hermes_agent.worker.fence import FENCE_SQL, FencedOut, fence
from hermes_agent.worker.store import LeaseLost, QueuedRun, RunStore

__all__ = [
    "FENCE_SQL",
    "FencedOut",
    "LeaseLost",
    "QueueClient",
    "QueuedRun",
    "RunHandle",
    "RunStore",
    "fence",
    "result_from_dict",
    "submit",
]
