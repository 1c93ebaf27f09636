"""The process stage and the lifecycle writes it shares with ingest, record and the DLQ.

Everything here talks only to ports and is driven by the compiled machines: the
``queue_gate`` flow decides what one delivery does, the ``request`` lifecycle decides
which state changes are legal and which of them take or release a build slot.
"""
