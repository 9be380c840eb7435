"""The fastest a batch's trajectories can be started here: workflow creation alone.

    python benchmarks/start_floor.py [--sizes 512 6400] [--concurrency 128]

Starts N workflows from one client, concurrently, on the embedded stack's file-backed
dev server with no worker polling, so nothing runs but the creation itself (the
workflows never get a first task). This is the floor under item 1 of issue 26 ("all
trajectories start within seconds, whatever the batch's size"): on 2 cores the server
alone creates about 160 workflows a second, so 6,400 take some 40 s before a single step
runs, and a live batch shares those cores with the steps of what it started first.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from heddle.runtime.stack import EmbeddedStack, free_port


async def create_all(size: int, concurrency: int) -> float:
    """Wall seconds to create `size` workflows, none of which ever runs."""
    with tempfile.TemporaryDirectory() as state_dir:
        stack = EmbeddedStack(
            state_dir=Path(state_dir), port=free_port(), headless=True, num_workers=0
        )
        client = await stack.start()
        try:
            gate = asyncio.Semaphore(concurrency)

            async def start(index: int) -> None:
                async with gate:
                    await client.start_workflow("Unpolled", id=f"w-{index}", task_queue="none")

            began = time.perf_counter()
            await asyncio.gather(*(start(i) for i in range(size)))
            return time.perf_counter() - began
        finally:
            stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 6400])
    parser.add_argument("--concurrency", type=int, default=128)
    args = parser.parse_args()
    print("| workflows | created in s | workflows/s |")
    print("|---:|---:|---:|")
    for size in args.sizes:
        wall_s = asyncio.run(create_all(size, args.concurrency))
        print(f"| {size:,} | {wall_s:.1f} | {size / wall_s:.0f} |", flush=True)


if __name__ == "__main__":
    main()
