"""Reef: an inference server that learns while it serves."""

__version__ = "0.1.0"
