"""Error types that decide behaviour across the control plane (STYLE.md habit 7).

Each passes all its fields to ``super().__init__`` so it pickles across actors.
"""

from __future__ import annotations


class DeployRejected(Exception):
    """The config is valid but cannot be applied to this instance (terminal)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
