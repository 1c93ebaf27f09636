"""The stages around the process decision: ingest, record, the dead-letter reconciler.

They talk only to ports and to the request lifecycle, like the process stage itself, so
the same objects run on in-memory adapters (simulate, check) and on JetStream. One
factory, :func:`.wiring.build_stages`, puts all of them together on one set of ports.
"""
