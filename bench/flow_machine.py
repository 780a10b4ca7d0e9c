"""The flow machine's cost per event with many instances: 100 handles of 1000 instances each
(100 000 live instances) by default, driven directly (no loop, no executor, no I/O).

Phases, each timed and printed in microseconds per event: creating the handles (one request
submits a whole handle), the submissions returning and the instances going ACTIVE, then a
steady state where random instances end and are replaced (the end, the replacement's
submission returning, its ACTIVE), the same with ends of a throttled class (restarts owed and
planned, not submitted), status requests, and a lease renewal. Prints figures only; the last
line is a JSON summary. Run: ``.venv/bin/python bench/flow_machine.py [--handles N]
[--per-handle N] [--events N]``.
"""

import argparse
import json
import os
import random
import resource
import time
from typing import Any, Dict, List

from _help import description

from psij import JobState, JobStatus
from psij.controller import (
    ActionDone,
    ActionKind,
    Connected,
    JobStatusChanged,
    MessageReceived,
    Peer,
    Submit,
    TimerFired,
)
from psij.flows.machine import WAKE, FlowConfig, FlowMachine

SPEC = {"executable": "/bin/sleep", "arguments": ["1000"]}


class Driver:
    def __init__(self, handles: int, per_handle: int) -> None:
        config = FlowConfig("/tmp/flow-bench", max_per_handle=per_handle,
                            max_total=handles * per_handle, max_per_user=handles * per_handle,
                            max_rate=1e6, max_submit_rate=1e6, aggregate_problem_interval=1.0,
                            default_intervals={"unknown": 60.0})
        self.machine = FlowMachine(config)
        self.now = 1_700_000_000.0
        self.events = 0
        self.submitted: List[str] = []
        self.native = 0
        self.rid = 0
        self.answers = 0
        self.step(Connected(1, Peer(1, 1000, 1000, ""), "unix"))

    def step(self, event: Any) -> List[Any]:
        self.events += 1
        actions = self.machine.step(event, self.now)
        for action in actions:
            if type(action) is Submit:
                self.submitted.append(action.key)
        return actions

    def request(self, op: str, **fields: Any) -> None:
        self.rid += 1
        message: Dict[str, Any] = {"id": self.rid, "op": op}
        message.update(fields)
        self.step(MessageReceived(1, message))

    def answer_submissions(self) -> List[str]:
        keys, self.submitted = self.submitted, []
        for key in keys:
            self.native += 1
            self.step(ActionDone(key, ActionKind.SUBMIT, str(self.native)))
        return keys

    def activate(self, keys: List[str]) -> None:
        for key in keys:
            self.step(JobStatusChanged(key, JobStatus(JobState.ACTIVE)))


def timed(driver: Driver, label: str, work: Any, figures: Dict[str, float], key: str) -> None:
    """Run ``work``; print and keep its wall-clock and CPU microseconds per event (the CPU
    figure is the one to compare when other processes load the machine)."""
    before = driver.events
    begin, cpu = time.perf_counter(), time.process_time()
    work()
    seconds, cpu = time.perf_counter() - begin, time.process_time() - cpu
    events = max(1, driver.events - before)
    figures[key] = seconds / events * 1e6
    figures[key.replace("_us", "_cpu_us")] = cpu / events * 1e6
    print(f"{label}: {events} events in {seconds:.2f} s, {figures[key]:.1f} µs per event "
          f"({cpu / events * 1e6:.1f} µs of CPU)")


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__ or ""))
    parser.add_argument("--handles", type=int, default=100)
    parser.add_argument("--per-handle", type=int, default=1000)
    parser.add_argument("--events", type=int, default=30000,
                        help="instance ends in each steady-state phase")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}")
    driver = Driver(args.handles, args.per_handle)
    rng = random.Random(1)
    handles: List[str] = []
    figures: Dict[str, float] = {}

    def create() -> None:
        for _ in range(args.handles):
            driver.request("create", spec=SPEC, executor="local", count=args.per_handle,
                           rate=1e6, lease=86400 * 7, provisioning_lease=86400)
        handles.extend(sorted(driver.machine.handles))

    timed(driver, f"create {args.handles} handles of {args.per_handle} (one event submits a "
          "whole handle)", create, figures, "create_us")
    keys: List[str] = []
    timed(driver, "submissions returning", lambda: keys.extend(driver.answer_submissions()),
          figures, "submitted_us")
    timed(driver, "instances going ACTIVE", lambda: driver.activate(keys), figures,
          "active_us")
    live = sum(len(driver.machine.handles[h].live) for h in handles)
    print(f"live instances: {live}")
    live_keys = list(keys)

    def churn(exit_code: int) -> None:
        # Throttled ends are not replaced at once: leave half of the instances alive.
        count = args.events if exit_code == 0 else min(args.events, len(live_keys) // 2)
        for _ in range(count):
            index = rng.randrange(len(live_keys))
            key = live_keys[index]
            driver.now += 0.001
            driver.step(JobStatusChanged(key, JobStatus(
                JobState.COMPLETED if exit_code == 0 else JobState.FAILED,
                exit_code=exit_code)))
            new = driver.answer_submissions()
            driver.activate(new)
            if new:
                live_keys[index] = new[0]
            else:
                live_keys[index] = live_keys[-1]
                live_keys.pop()

    timed(driver, "steady state: an instance ends (exit 0), its replacement is submitted, "
          "returns and goes ACTIVE", lambda: churn(0), figures, "replace_us")
    timed(driver, "an instance ends with a throttled class (exit 1), its restart is owed and "
          "planned", lambda: churn(1), figures, "throttled_us")

    def fire_timers() -> None:
        for _ in range(1000):
            driver.now += 1.0
            driver.step(TimerFired(WAKE))
            driver.activate(driver.answer_submissions())

    timed(driver, "1000 timer wake-ups a second apart (owed restarts released one a second "
          "across all handles)", fire_timers, figures, "timer_us")

    def statuses() -> None:
        for _ in range(1000):
            driver.request("status", handle=rng.choice(handles))

    timed(driver, f"status requests ({args.per_handle} instances per handle)", statuses,
          figures, "status_us")

    def renewals() -> None:
        for _ in range(1000):
            driver.request("renew", handle=rng.choice(handles), lease=86400 * 7,
                           provisioning_lease=86400)

    timed(driver, "lease renewals", renewals, figures, "renew_us")
    records = sum(len(driver.machine.handles[h].records) for h in handles)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"instance records kept: {records}; max RSS {rss / 1024:.0f} MiB")
    summary: Dict[str, Any] = {k: round(v, 2) for k, v in figures.items()}
    summary.update(live=live, records=records, max_rss_mib=round(rss / 1024))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
