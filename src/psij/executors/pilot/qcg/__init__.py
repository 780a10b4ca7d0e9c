"""The pilot's QCG-PilotJob file interface: ``psij pilot run REQUESTS.json``.

``run`` (the command: the order of requests and the files it writes, ``service.log`` and
``jobs.report``) is what the command line calls; the rest is its own: ``_schema`` (the checked
request records), ``_requests`` (reading and checking a request file), ``_plan`` (requests made
into tasks), ``_report`` (QCG's states, report entries and responses) and ``_books`` (job names,
iterative jobs as counters, ``jobs.report``). ``_schema``, ``_requests``, ``_plan`` and
``_report`` are pure: no I/O but reading the request file, no clock, no thread.

This package feeds the pilot's engine and never the other way round: no module of the engine,
the scheduler or the PSI/J executor imports it, and importing the package loads none of its
modules (the command imports ``run`` only when it runs).
"""
