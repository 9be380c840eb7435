"""Which engine blocks the trainer takes (Libra's lever inside an asynchronous campaign).

Pure, like the rest of `scheduler/`: the campaign passes the blocks (engine instances) and
the trainer's state, and gets back the blocks to move to the trainer now. Libra publishes
the idea (workers move between rollout and training so that neither idles); the rules
here are ours:

- a block that holds no trajectory and runs no step trains if the step would outlast
  its move both ways (joining the trainer, and its engine's restart when it goes back):
  it costs the rollout nothing now, the step shortens, and the rollout gets it back
  later than it would have by the restart;
- at a step's start the trainer takes at least `min_gpus` (its share in the fixed split
  this is measured against), the least loaded blocks first, narrowest among equals: their
  running steps move to other blocks with their KV. Without that floor a rollout that
  never idles a block would leave the step waiting;
- one block always stays with the rollout (trajectories may be admitted any time);
- every block goes back to the rollout when the step's weights are synced, so between
  steps the whole cluster rolls out (the trainer has nothing to do until a batch is
  ready); except that when the trainer's last wait between steps, or its last step, was
  shorter than a block's move both ways, it keeps its floor (`blocks_to_keep`): the
  rollout would have the blocks for less than the move costs, or the next step would
  wait for its floor to join longer than it trains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Block:
    """One engine instance as the reallocation rule sees it."""

    instance_id: str
    tp: int
    load: int  # trajectories it holds and steps it runs: what moving it to the trainer moves
    training: bool  # lent to the trainer now
    restart_s: float = 0.0  # its engine's restart when it goes back to the rollout


def blocks_for_trainer(
    blocks: Sequence[Block],
    *,
    trainer_gpus: int,
    min_gpus: int,
    train_left_s: float,
    join_s: float,
) -> list[str]:
    """The blocks to move to the trainer now. `trainer_gpus`: the GPUs it has (its own
    and the blocks lent, joined or joining); `train_left_s`: the step's time left at
    that many (infinite with none); `join_s`: a block's time to start training."""
    rolling = [b for b in blocks if not b.training]
    if not rolling:
        return []
    taken: list[str] = []
    gpus = trainer_gpus
    kept = len(rolling)
    for block in sorted(rolling, key=lambda b: (b.load, b.tp, b.instance_id)):
        idle = block.load == 0
        useful = idle and join_s + block.restart_s < train_left_s
        if not (useful or gpus < min_gpus):
            continue
        if kept == 1:
            break  # the rollout keeps its last block
        taken.append(block.instance_id)
        gpus += block.tp
        kept -= 1
    return taken


def blocks_to_keep(
    lent: Sequence[Block], *, min_gpus: int, last_wait_s: float, last_step_s: float,
    join_s: float,
) -> list[str]:  # fmt: skip
    """The lent blocks the trainer keeps through the sync (they go back to the rollout
    no sooner than the next step ends): its floor, the narrowest first, when its last
    wait for a batch or its last step was shorter than a block's move both ways."""
    kept: list[str] = []
    gpus = 0
    for block in sorted(lent, key=lambda b: (b.tp, b.instance_id)):
        move_s = join_s + block.restart_s
        if gpus >= min_gpus or min(last_wait_s, last_step_s) >= move_s:
            break
        kept.append(block.instance_id)
        gpus += block.tp
    return kept
