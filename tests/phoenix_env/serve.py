"""`phoenix serve`, with its OTLP gRPC listener on 127.0.0.1.

Phoenix binds its gRPC receiver to every interface (`[::]:<PHOENIX_GRPC_PORT>`, written into
phoenix/server/grpc_server.py, no setting for it), while servers our tests start bind to the
loopback only. The test sends OTLP/HTTP, which PHOENIX_HOST already keeps on 127.0.0.1; this
launcher, run by Phoenix's own interpreter, narrows the gRPC address the same way before
handing over to Phoenix's entry point. test_phoenix.py checks where both ports listen.
"""

import sys

from grpc.aio import _server


def _loopback(add):
    def add_port(self, address, *args):
        if address.startswith("[::]:"):
            address = "127.0.0.1:" + address[len("[::]:"):]
        return add(self, address, *args)
    return add_port


_server.Server.add_insecure_port = _loopback(_server.Server.add_insecure_port)
_server.Server.add_secure_port = _loopback(_server.Server.add_secure_port)

from phoenix.server.main import main  # noqa: E402  (after the patch: it builds the server)

sys.argv = ["phoenix", *sys.argv[1:]]
sys.exit(main())
