"""The gRPC receiver as its own process (for tests that run the agent as a real process).

    python receiver_proc.py PORT OUTFILE

Appends every request it accepts to OUTFILE as `<8-byte length><ExportTraceServiceRequest>`,
flushed at once, and prints `ready` when it listens. Stop it with SIGTERM.
"""

import os
import signal
import struct
import sys
import threading

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(1, os.path.join(os.path.dirname(__file__), ".."))  # receivers imports bridge (not installed)

from receivers import GrpcReceiver  # noqa: E402


class FileReceiver(GrpcReceiver):
    def __init__(self, port: int, out: str) -> None:
        super().__init__(port=port)
        self._out = open(out, "ab")
        self._wlock = threading.Lock()

    def add(self, raw: bytes) -> None:
        with self._wlock:
            self._out.write(struct.pack(">Q", len(raw)) + raw)
            self._out.flush()


def read_requests(path: str) -> list[bytes]:
    out = []
    with open(path, "rb") as f:
        data = f.read()
    i = 0
    while i + 8 <= len(data):
        (n,) = struct.unpack(">Q", data[i:i + 8])
        if i + 8 + n > len(data):
            break
        out.append(data[i + 8:i + 8 + n])
        i += 8 + n
    return out


if __name__ == "__main__":
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with FileReceiver(int(sys.argv[1]), sys.argv[2]):
        print("ready", flush=True)
        done.wait()
