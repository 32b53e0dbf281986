"""The Ray transport (``runtime=ray``): the party interface implemented by Ray actors, which the
run's picklable party factory builds; never imports ``run/`` or ``train``."""

import os

# gRPC's C core logs every failed TLS handshake of a reconnecting channel and every failed bind to
# stderr; the runtime reports such a failure in its own one error: line instead. A user who sets
# GRPC_VERBOSITY (e.g. debug) keeps gRPC's logs.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
