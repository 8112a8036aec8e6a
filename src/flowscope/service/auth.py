"""Who may talk to a collector: a bearer token on every request once it is bound beyond loopback."""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
import socket

TOKEN_ENV = "FLOWSCOPE_TOKEN"


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is a loopback address (127.0.0.0/8, ::1, 'localhost')."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


class TokenAuth:
    """ASGI middleware: answers 401 to any request (every route, unknown ones too) that does not carry
    ``Authorization: Bearer <token>``; the comparison takes the same time wherever the tokens differ."""

    def __init__(self, app, token: str):
        if not token:
            raise ValueError("an empty token would let anyone in")
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket"):
            given = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self._expected):
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await _refuse(send, "missing" if not given else "wrong")
                return
        await self.app(scope, receive, send)


async def _refuse(send, what: str) -> None:
    body = json.dumps({"error": f"{what} token: this collector needs 'Authorization: Bearer <token>' on every "
                                f"request (clients send ${TOKEN_ENV} or the token in the address file)"}).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", b'Bearer realm="flowscope"')]})
    await send({"type": "http.response.body", "body": body})
