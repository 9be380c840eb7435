"""Timeouts and retry policies of the activities the workflows call, in one place."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

STORE_TIMEOUT = timedelta(seconds=30)
DECIDE_TIMEOUT = timedelta(seconds=10)
# A decide keeps being retried while no engine instance takes steps (a plan starting);
# past this the trajectory fails with the reason rather than wait for ever.
DECIDE_GIVE_UP = timedelta(minutes=15)
# Retried soon: a decide that finds no instance is waiting for a plan that is seconds away.
SCHEDULER_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=100),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=1),
)
# A step may wait long in an engine's queue behind others; progress is heartbeated.
GENERATE_TIMEOUT = timedelta(hours=2)
GENERATE_HEARTBEAT = timedelta(seconds=30)
TOOL_TIMEOUT = timedelta(minutes=5)
TOOL_HEARTBEAT = timedelta(seconds=30)
# A verifier's own limit (unit tests' timeout, or the activity's grace) comes first.
VERIFY_TIMEOUT = timedelta(minutes=10)
# How often a worker sends an activity's heartbeats on (Temporal's default is 80% of the
# heartbeat timeout: 24 s of the 30, so a worker slowed by a busy machine could time its
# own steps out). Workers that run heartbeating activities pass this. Every running or
# queued step heartbeats: at 2 s (and a 10 s timeout) 512 steps in flight sent the
# server 250 heartbeats a second, more than the steps themselves cost it.
HEARTBEAT_THROTTLE = timedelta(seconds=5)
# A batch plan (prediction, TP search, DP) and the reshape to its split (drain + restart).
PLAN_TIMEOUT = timedelta(minutes=10)
# A planned batch may wait this long for the one before it to finish.
CLAIM_TIMEOUT = timedelta(days=2)
RESHAPE_TIMEOUT = timedelta(hours=2)
RESHAPE_HEARTBEAT = timedelta(seconds=30)
MIGRATE_TIMEOUT = timedelta(minutes=1)


def retry(max_attempts: int) -> RetryPolicy:
    return RetryPolicy(
        initial_interval=timedelta(milliseconds=200),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=max_attempts,
    )


# Store writes are idempotent; keep trying for a while before giving up.
STORE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=20,
)
