"""A JetStream API request answered as the server wrote it.

The typed client drops fields it does not know (a stream configuration sent back from
it would reset them) and has no call for some requests (stream names by subject), so
the few requests that need either go through here.
"""

from __future__ import annotations

import json
from typing import Any

from nats.js import JetStreamContext

#: Seconds to wait for the server's answer, as the typed client does by default.
TIMEOUT_S = 5.0


async def api_request(js: JetStreamContext, request: str, body: bytes = b"") -> dict[str, Any]:
    """The answer to ``$JS.API.<request>`` (under the context's API prefix), decoded."""
    reply = await js._nc.request(f"{js._prefix}.{request}", body, timeout=TIMEOUT_S)
    answer: dict[str, Any] = json.loads(reply.data)
    return answer
