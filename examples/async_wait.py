"""Await 1000 local jobs from asyncio, and follow one job's states as they change.

    python examples/async_wait.py [COUNT]

``Job.wait_async`` and ``Job.status_changes`` are woken by the jobs' status notifications:
nothing polls, and no thread is started per job.
"""

import asyncio
import sys
from collections import Counter

from psij import Job, JobExecutor, JobSpec


async def main(count: int) -> Counter:
    executor = JobExecutor.get_instance("local")
    # Every seventh job fails, to show that failures come back as statuses, not exceptions.
    jobs = [Job(JobSpec("/bin/sh", ["-c", "exit 1" if i % 7 == 0 else "exit 0"]))
            for i in range(count)]
    for job in jobs:
        executor.submit(job)
    statuses = await asyncio.gather(*(job.wait_async(timeout=600) for job in jobs))
    outcome = Counter(status.state.name if status else "TIMED OUT" for status in statuses)

    watched = Job(JobSpec("/bin/sleep", ["0.2"]))
    executor.submit(watched)
    async for status in watched.status_changes():
        print("watched job:", status.state.name)
    return outcome


if __name__ == "__main__":
    counts = asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000))
    print(" ".join(f"{state}={n}" for state, n in sorted(counts.items())))
