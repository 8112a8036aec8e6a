"""Who may talk to a collector: a bearer token on every request once it is bound beyond loopback."""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
import socket

TOKEN_ENV = "FLOWSCOPE_TOKEN"
#: the cookie a browser holds the token in, once it opened a dashboard page with ``?token=``
COOKIE = "flowscope_token"
#: where a browser may hand over the token in the query string (the dashboard's pages)
PAGE_PREFIX = "/ui"


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


def cross_site(headers) -> bool:
    """Whether a WebSocket's handshake ``headers`` come from a page of another site (its Origin is not this host):
    such a page may not read runs through the user's browser."""
    from urllib.parse import urlsplit

    origin = headers.get("origin")
    return bool(origin) and urlsplit(origin).netloc != headers.get("host")


def _cookie(headers, name: str) -> bytes:
    """The value of cookie ``name`` in the request's Cookie headers (b"" if absent)."""
    from http.cookies import CookieError, SimpleCookie

    for k, v in headers:
        if k == b"cookie":
            jar = SimpleCookie()
            try:
                jar.load(v.decode("latin-1"))
            except CookieError:
                continue
            if name in jar:
                return jar[name].value.encode()
    return b""


class TokenAuth:
    """ASGI middleware: answers 401 to any request (every route, unknown ones too) that does not carry
    ``Authorization: Bearer <token>``; the comparison takes the same time wherever the tokens differ.

    A browser cannot set that header on a page or a WebSocket, so for the dashboard: a GET of a page under
    ``/ui`` with ``?token=<token>`` is answered with a redirect to the same page without it, setting the token
    in an HttpOnly, SameSite=Strict cookie; that cookie then stands for the header on GET requests and
    WebSockets (reading), never on requests that write."""

    def __init__(self, app, token: str):
        if not token:
            raise ValueError("an empty token would let anyone in")
        self.app = app
        self._token = token.encode()
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = scope.get("headers", ())
            given = next((v for k, v in headers if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self._expected):
                reading = scope["type"] == "websocket" or scope.get("method") in ("GET", "HEAD")
                if reading and hmac.compare_digest(_cookie(headers, COOKIE), self._token):
                    await self.app(scope, receive, send)
                    return
                if reading and scope["type"] == "http" and scope.get("path", "").startswith(PAGE_PREFIX):
                    from urllib.parse import parse_qsl, urlencode

                    query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
                    offered = next((v for k, v in query if k == "token"), "").encode()
                    if offered and hmac.compare_digest(offered, self._token):
                        rest = urlencode([(k, v) for k, v in query if k != "token"])
                        await _to_page_with_cookie(send, scope["path"] + (f"?{rest}" if rest else ""), self._token)
                        return
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await _refuse(send, "missing" if not given else "wrong")
                return
        await self.app(scope, receive, send)


async def _to_page_with_cookie(send, location: str, token: bytes) -> None:
    await send({"type": "http.response.start", "status": 303,
                "headers": [(b"location", location.encode("latin-1")), (b"content-length", b"0"),
                            (b"cache-control", b"no-store"),
                            (b"set-cookie", COOKIE.encode() + b"=" + token + b"; Path=/; HttpOnly; SameSite=Strict")]})
    await send({"type": "http.response.body", "body": b""})


async def _refuse(send, what: str) -> None:
    body = json.dumps({"error": f"{what} token: this collector needs 'Authorization: Bearer <token>' on every "
                                f"request (clients send ${TOKEN_ENV} or the token in the address file)"}).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", b'Bearer realm="flowscope"')]})
    await send({"type": "http.response.body", "body": body})
