# For Jupyter Server 1.x run with --gateway-url (GatewayClient): put this
# file in a directory of `jupyter --paths` (config), or pass it with
# --config. Jupyter Server 2 does not need it.
#
# Jupyter Server 1.x opens its websocket to the gateway in a callback it
# schedules when a client's websocket opens. A message from the client that
# it reads before that callback has run (the client sent it right after the
# handshake, and the server was busy) waits on a connection that never
# comes: the gateway never sees it, and the client waits for its reply,
# typically the kernel_info_request a front-end sends first. This subclass
# holds such a message until the connection to the gateway has started.
from tornado.ioloop import IOLoop

from jupyter_server.gateway import handlers


def _hold_early_messages(base):
    class GatewayWebSocketClient(base):
        def on_message(self, message):
            if self.kernel_id is None:  # the connection has not started yet
                IOLoop.current().add_callback(self.on_message, message)
                return
            super().on_message(message)

    return GatewayWebSocketClient


if hasattr(handlers, "GatewayWebSocketClient"):  # Jupyter Server 1.x
    handlers.GatewayWebSocketClient = _hold_early_messages(handlers.GatewayWebSocketClient)
