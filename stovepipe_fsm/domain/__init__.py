"""Domain values: Request, Queue, QueueConfig, request ids, hook events, errors.

Entities are immutable snapshots (frozen dataclasses). A write replaces the whole
snapshot under a compare-and-set on ``version``; see ``stovepipe_fsm.ports.stores``.
"""
