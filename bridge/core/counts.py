"""Counts a stage keeps of what it did: one declarative form for every such record.

A stage's counts are a slotted dataclass of ints, each 0 at first, that the stage adds to and
the agent's health and metrics read by name (`dataclasses.fields`). `counts` makes one from its
docstring, which lists each count as `name: what it counts`: the record and what its fields
mean are written once, and read by people and code alike. Fields that are not counts (a deque
of latencies) follow as `dataclasses.make_dataclass` takes them.
"""

from __future__ import annotations

import re
from dataclasses import field, make_dataclass

_COUNT = re.compile(r"^\s+(\w+): (.+)$", re.MULTILINE)


def counts(name: str, module: str, doc: str, *more: tuple) -> type:
    """A slotted dataclass `name` (of `module`, documented by `doc`) with an int field, 0 at
    first, for each `name: what it counts` line of `doc` (the field's `doc` metadata), in
    order, then the fields in `more`."""
    fields = [(key, int, field(default=0, metadata={"doc": what})) for key, what in _COUNT.findall(doc)]
    if not fields:
        raise ValueError(f"{name}: its docstring lists no `name: what it counts` line")
    cls = make_dataclass(name, [*fields, *more], slots=True)
    cls.__module__, cls.__doc__ = module, doc
    return cls
