"""What a restart skips: requests delivered before it, while an older request held the
checkpoint back (`tail.checkpoint.Delivered`). Their lines are read again but not fed, so they
are not rebuilt and sent twice; an engine span delivered before is not sent again.

The key a delivered timeline is listed under (`key`) and the keys a line's request id may have
been listed under (`assemble.ids.keys`) are each spelled once, here and there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from bridge.assemble import EngineTimeline, Timeline, ids
from bridge.parse.events import KvLeaseExpired, Stamped


def key(t: Timeline) -> str:
    """The key a timeline is delivered (and checkpointed) under: its request's, or for an
    engine span `engine@<its first line's position>`."""
    return f"engine@{t.first_offset}" if isinstance(t, EngineTimeline) else t.request_id


def sent_before(skip: Mapping[str, int], t: Timeline) -> bool:
    """An engine timeline delivered before the restart. (A request's lines were not fed, so
    its timeline is never rebuilt; an engine-wide line always is: see `unsent`.)"""
    return isinstance(t, EngineTimeline) and skip.get(key(t), -1) >= t.first_offset


def delivered(skip: Mapping[str, int], rid: str, offset: int) -> bool:
    """Whether the line at `offset` naming `rid` belongs to a request delivered before."""
    for k in ids.keys(rid):
        last = skip.get(k)
        if last is not None and offset <= last:
            return True
    return False


def unsent(skip: Mapping[str, int], offset: int, event):
    """`event` (of the line at `offset`) minus what belongs to requests delivered before: the
    same object when nothing does, a copy naming fewer requests, or None when all do."""
    if type(event) is Stamped:  # a user rule's event with its line's own time
        inner = unsent(skip, offset, event.event)
        return event if inner is event.event else None if inner is None else dataclasses.replace(event, event=inner)
    rids = getattr(event, "request_ids", None)
    if rids is not None:
        keep = tuple(i for i in rids if not delivered(skip, i, offset))
        if len(keep) == len(rids):
            return event
        return dataclasses.replace(event, request_ids=keep) if keep else None
    if type(event) is KvLeaseExpired and any(k in skip for k in ids.keys(event.engine_request_id)):
        # NIXL's expiry comes after the prefill's last line and opens a root only for a prefill
        # never seen, none for one emitted already (kvlines `_on_kv_lease_expired`): one delivered
        # before the restart was, whatever the offset
        return None
    rid = getattr(event, "request_id", None)
    # An engine-wide line is always fed: the requests in flight then carry its event, as they
    # did the first time. Only its own span, if delivered, is not sent again (`sent_before`).
    if rid is not None and delivered(skip, rid, offset):
        return None
    return event
