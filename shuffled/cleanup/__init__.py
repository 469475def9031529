"""Expiry of supervisor tasks' data: pure policy, idempotent sweeper, apscheduler wiring."""
