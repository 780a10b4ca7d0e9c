"""The job registry's private parts: :mod:`.store` (the SQLite file, its tables, opening,
checking, writing and reading it) and :mod:`.recorder` (what every executor's status change
records, queued and written by one thread per process). The public API is :mod:`psij.registry`,
which imports both; :mod:`.durable` makes a job's row at submit, for the executors that must not
lose a job their ``submit`` returned for.

This package stands apart from :mod:`psij.registry` because the recorder is imported by
:mod:`psij.job_executor` on every job's first status change, while :mod:`psij.registry` imports
the executors: one package holding both would import itself in a circle. So this ``__init__``
imports nothing: importing the recorder loads neither :mod:`psij.registry` nor :mod:`sqlite3`
(only the store loads it, when the writer thread first opens a registry).
"""
