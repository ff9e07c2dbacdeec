"""Randomized real-vLLM workloads (issue #31): a seeded generator of server set-ups and
requests (generator), a client that records its own truth (client), a runner that starts vLLM
and writes its CRI log (workload), and the invariants that hold the bridge's spans to the
client's record (invariants). tests/test_randomized.py runs them."""
