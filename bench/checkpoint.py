"""What one checkpoint save costs the agent while a request stays unfinished.

    python bench/checkpoint.py [--listed 0,1000,10000,50000] [--root CHECKOUT]

The agent saves after every acknowledged batch. A request that never finishes (a hung client,
a lost end line) holds the safe position still until its TTL, so every request delivered
after it stays listed in the checkpoint: at 100 requests/s and the 600 s default TTL, 60,000
entries. This runs the agent's own `Checkpointer.save` on one real file with such a request
pending and `--listed` entries delivered after it, adding 64 entries (one batch's worth of
requests) before each save, and prints the CPU per save (least of the rounds, so load from
other work on the machine does not count) and the file's size. `--root` measures another
checkout's code on the same workload (before/after).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--listed", default="0,1000,10000,50000")
    ap.add_argument("--saves", type=int, default=40)
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.root))
    from bridge.resume import Checkpointer
    from bridge.sources import Pending, SourceState
    from bridge.tail.checkpoint import Delivered
    from bridge.tail.follow import Filters, Follower

    print(f"code: {os.path.abspath(args.root)}; CPU per Checkpointer.save, least of {args.saves} saves, "
          "64 entries added before each")
    print("| delivered entries listed | CPU ms per save | checkpoint file |")
    print("|---:|---:|---:|")
    for listed in (int(x) for x in args.listed.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "a.log")
            with open(log, "wb") as f:
                f.write(b"x\n" * 1000)
            follower = Follower(Filters((log,)))
            follower.discover(first_round=True)
            for _ in follower.poll():
                pass
            (tf,) = follower.files
            st = SourceState(tf.source)
            st.pending[0] = Pending(10, "stuck", 12)  # never acked: the floor stays at 10
            st.delivered = [Delivered(f"chatcmpl-{i:032x}", 100 + i) for i in range(listed)]
            ckpt = Checkpointer(os.path.join(tmp, "state"), None)
            os.makedirs(ckpt.store.state_dir)
            sources = {tf.source.key: st}
            n, best = listed, float("inf")
            for _ in range(args.saves):
                st.delivered += [Delivered(f"chatcmpl-{i:032x}", 100 + i) for i in range(n, n + 64)]
                n += 64
                t = time.process_time()
                ok = ckpt.save(follower, sources, (), lambda key: st)
                best = min(best, time.process_time() - t)
                assert ok
            size = os.path.getsize(ckpt.store.path)
            print(f"| {listed:,} | {best * 1e3:.2f} | {size / 1024:,.0f} KiB |")
            follower.close()


if __name__ == "__main__":
    main()
