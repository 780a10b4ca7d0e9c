"""Flows: "keep N jobs running" handles with leases, throttled restarts and instance records.

:mod:`psij.flows.machine` holds the rules (a pure machine for :mod:`psij.controller`); the
service, its client and the ``flow`` executor run it. The flows guide describes the concepts.
"""
