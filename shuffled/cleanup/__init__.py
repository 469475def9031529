"""Expiry of supervisor tasks' data: pure policy, idempotent sweeper, apscheduler wiring.

``shuffled.cleanup.scheduler`` is the only module importing apscheduler; import it directly.
"""

from shuffled.cleanup.overlord import OverlordClient
from shuffled.cleanup.policy import Cause, TaskState
from shuffled.cleanup.sweeper import Sweeper, SweepResult

__all__ = ["Cause", "OverlordClient", "SweepResult", "Sweeper", "TaskState"]
