"""Spec layer: machine and config files as data, validated and compiled."""
