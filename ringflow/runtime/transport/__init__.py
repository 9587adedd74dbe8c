"""Transports: shared memory (same host) and TCP (between hosts), behind one connection table."""
from __future__ import annotations

from .manager import PeerCard, Transport

__all__ = ["PeerCard", "Transport"]
