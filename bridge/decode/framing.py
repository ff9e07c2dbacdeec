"""Container runtime framing: what wraps a log line on disk before vLLM's own text.

Each unwrapper takes one physical line (newline removed) and returns
`(runtime_ts, is_partial, text)`, or None when the line is not in that framing.
"""

from __future__ import annotations

import re

from bridge.decode.clock import Rfc3339
from bridge.decode.jsonline import loads, text as json_text

PLAIN, CRI, DOCKER, CLOUD = "plain", "cri", "docker", "cloud"

_CRI_SHAPE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\S* (?:stdout|stderr) [PF]")


def detect(first_line: str) -> str:
    """The framing of a file, judged by its first non-empty line."""
    if first_line.startswith("{") and '"textPayload"' in first_line:
        return CLOUD
    if first_line.startswith("{") and '"log"' in first_line:
        return DOCKER
    if _CRI_SHAPE.match(first_line):
        return CRI
    return PLAIN


STDOUT, STDERR = "stdout", "stderr"
_STREAMS = {STDOUT: STDOUT, STDERR: STDERR}


class CriUnwrapper:
    """containerd / CRI-O: `<RFC3339Nano> stdout|stderr P|F <text>`. `stream`: the last line's
    stream; the kubelet writes each stream's `P` parts independently, so they join per stream."""

    __slots__ = ("_stamp", "stream")

    def __init__(self) -> None:
        self._stamp = Rfc3339()
        self.stream = ""

    def __call__(self, line: str) -> tuple[int, bool, str] | None:
        parts = line.split(" ", 3)
        if len(parts) < 3 or parts[2] not in ("F", "P") or parts[1] not in ("stdout", "stderr"):
            return None
        ts = self._stamp(parts[0])
        if ts is None:
            return None
        self.stream = _STREAMS[parts[1]]
        return ts, parts[2] == "P", parts[3] if len(parts) == 4 else ""


class DockerUnwrapper:
    """docker json-file: `{"log": "...\\n", "stream": "stdout", "time": "..."}`.

    Docker splits lines over 16 KiB into entries without the trailing newline: those are partial.
    """

    __slots__ = ("_stamp", "stream")

    def __init__(self) -> None:
        self._stamp = Rfc3339()
        self.stream = ""

    def __call__(self, line: str) -> tuple[int, bool, str] | None:
        obj = loads(line)
        try:
            text, stamp = obj["log"], obj["time"]
        except (KeyError, TypeError, IndexError):
            return None
        if not isinstance(text, str) or not isinstance(stamp, str):
            return None
        stream = obj.get("stream") if isinstance(obj, dict) else None
        self.stream = _STREAMS.get(stream, "") if isinstance(stream, str) else ""
        text = json_text(text, line)
        ts = self._stamp(stamp)
        if ts is None:
            return None
        if text.endswith("\n"):
            return ts, False, text[:-1]
        return ts, True, text


class CloudUnwrapper:
    """Google Cloud Logging's exported entries, one JSON object a line (a GKE log sink, or
    `gcloud logging read --format=json` flattened): the container's line is `textPayload`, the
    time the runtime stamped it `timestamp`. Always whole lines: the runtime joined its parts."""

    __slots__ = ("_stamp",)

    def __init__(self) -> None:
        self._stamp = Rfc3339()

    def __call__(self, line: str) -> tuple[int, bool, str] | None:
        obj = loads(line)  # bounded: None for what is not JSON, however deep
        if not isinstance(obj, dict):
            return None
        text, stamp = obj.get("textPayload"), obj.get("timestamp")
        if not isinstance(text, str) or not isinstance(stamp, str):
            return None
        ts = self._stamp(stamp)
        if ts is None:
            return None
        return ts, False, json_text(text, line).rstrip("\n")  # lone surrogates replaced
