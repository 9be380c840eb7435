"""Activity names, shared by the activities that define them and the workflows that call
them by name, so `workflows/` never imports the activity implementations (and their
SQLAlchemy, engines or tools) into the deterministic sandbox."""

from __future__ import annotations

DECIDE = "decide"
ANTICIPATE = "anticipate"
REPORT_STEP = "report_step"
REPORT_DONE = "report_done"
GENERATE = "generate"
RUN_TOOL = "run_tool"
REWARD = "reward"
VERIFY = "verify"
BEGIN_BATCH = "begin_batch"
LOAD_SPECS = "load_specs"
MARK_STARTED = "mark_started"
RECORD_STEP = "record_step"
FINISH_TRAJECTORY = "finish_trajectory"
END_TRAJECTORY = "end_trajectory"
FINISH_BATCH = "finish_batch"
WAIT_DRAINED = "wait_drained"
WAIT_STARTED = "wait_started"
CLAIM_SPLIT = "claim_split"
RELEASE_SPLIT = "release_split"
PLAN_BATCH = "plan_batch"
APPLY_SPLIT = "apply_split"
MIGRATE_KV = "migrate_kv"
OPEN_ITERATION = "open_iteration"
RECORD_ITERATION = "record_iteration"
PREPARE_CAMPAIGN = "prepare_campaign"
TRAIN_STEP = "train_step"
TRAIN_SLICE = "train_slice"
SYNC_WEIGHTS = "sync_weights"
LEND_BLOCKS = "lend_blocks"
LEND_IDLE_BLOCKS = "lend_idle_blocks"
LEND_TAIL_BLOCKS = "lend_tail_blocks"
GIVE_BACK_BLOCKS = "give_back_blocks"

# The error type of a step whose engine died: its details hold the tokens made, and the
# workflow continues the step on another instance.
ENGINE_DEAD = "EngineDead"
