"""The flow executor shipped with psij: jobs carried by the handles of a flow service (read by
psij._plugins; no __init__.py in this folder)."""

from packaging.version import Version

from psij.descriptor import Descriptor

__PSI_J_EXECUTORS__ = [
    Descriptor(name="flow", nice_name="Flow (jobs on the handles of a flow service)",
               version=Version("0.1.0"), cls="psij.flows.executor.FlowJobExecutor"),
]
