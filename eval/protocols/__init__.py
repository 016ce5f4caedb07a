"""Benchmark protocols, registered once: `benchmark=<name>` of `python -m eval.run` picks one.

Each module under eval/protocols/ defines its `PROTOCOL` (eval/protocols/base.py): options check,
loader, replay of one unit through a method, summary. Adding a benchmark is one module and one line here.
"""

from __future__ import annotations

from . import beam, branchmem, conversations, irc, locomo, longmemeval
from .base import Protocol

PROTOCOLS: dict[str, Protocol] = {m.PROTOCOL.name: m.PROTOCOL for m in (branchmem, locomo, longmemeval, beam, irc,
                                                                   conversations)}
BENCHMARKS = tuple(PROTOCOLS)
