"""core: the value types every stage shares, below all of them.

A line's origin (`Source`: which stream, which file, its Kubernetes identity) and its position
(`GEN_SHIFT`: a file's generation and byte offset in one int) travel with every record from the
tail to the exporter. They live here, not in `tail`, so the stages after it know files only
through these values and import nothing of the code that reads them. This package imports no
other part of the bridge (tests/test_imports.py).
"""

from bridge.core.position import GEN_SHIFT, IN_FILE
from bridge.core.source import Source

__all__ = ["GEN_SHIFT", "IN_FILE", "Source"]
