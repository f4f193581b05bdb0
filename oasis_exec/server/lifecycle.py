"""Shutdown with a grace period: `GracefulServer`, uvicorn's server with an orderly end for running requests.

On SIGTERM or SIGINT uvicorn would wait for connections and then cancel what still runs, cutting streams. Here
the server first stops accepting connections, then gives the requests in flight `grace_s` seconds to finish
(`EngineLoop.drain`; new submissions meanwhile get a 503), then ends every one still running with an explicit
OpenAI-style error -- a 503 `server_shutting_down` body, or in a stream an error event followed by `[DONE]` --
and only then lets uvicorn close the connections and run the app's shutdown (the engine thread stops, a
`--record` recording is written).
"""

from __future__ import annotations

import uvicorn


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, *, engine_loop, grace_s: float) -> None:
        super().__init__(config)
        self.engine_loop = engine_loop
        self.grace_s = grace_s

    async def shutdown(self, sockets=None) -> None:
        for server in self.servers:  # stop accepting connections (uvicorn's shutdown closes them again: a no-op)
            server.close()
        for sock in sockets or []:
            sock.close()
        await self.engine_loop.drain(self.grace_s)
        await super().shutdown(sockets=None)
