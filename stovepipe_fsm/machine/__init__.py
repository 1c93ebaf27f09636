"""The machine language: machine files loaded, linted, compiled into ``transitions``
machines and drawn; registries, plugins, parameters and invariants."""
