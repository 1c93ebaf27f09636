"""Applications over the core: the collaborators process needs (ingest, record, the
dead-letter reconciler), the simulator, the model checker, the service and the CLI.
"""
