"""tail: find log files and hand out their physical lines with byte offsets.

`replay` reads finished files once (this module); the long-lived follower that survives
rotation and keeps checkpoints lives beside it.
"""

from bridge.tail.files import read_lines

__all__ = ["read_lines"]
