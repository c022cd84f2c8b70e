"""Asking a downstream system whether a write happened: the request a tenant's Reconciler describes,
made so that it cannot be turned against anyone else.

- the template's scheme and host are fixed: http(s), no credentials in the URL, no placeholder
  before the path (an id cannot choose the host);
- the ids go in percent-encoded, and a path segment that would read `.` or `..` is refused;
- the host's addresses are resolved once, every one must be public (not private, loopback,
  link-local, multicast, reserved, unspecified) unless LOOPWATCH_RECONCILER_ALLOWED_HOSTS names
  the host or the address, and the connection goes to that address (no second lookup to rebind);
- no redirect is followed: a 3xx is an answer that says nothing (the credentials go nowhere else);
- at most MAX_BODY_BYTES are read, and the answer kept is the verdict's field plus the fields the
  reconciler declares (`keep_fields`), never the whole body.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import orjson
from django.conf import settings

PLACEHOLDERS = ("{operation_key}", "{external_request_id}")
MAX_BODY_BYTES = 1 << 20
MAX_KEPT_BYTES = 2000  # a declared field bigger than this is not kept (it says so)


def url_template_problem(template: str) -> str:
    """Why a reconciler's URL template cannot be used, or "" when it can."""
    if not any(p in template for p in PLACEHOLDERS):
        return "must contain {operation_key} or {external_request_id}"
    parts = urlsplit(template)
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if "{" in parts.netloc or "}" in parts.netloc:
        return "the host cannot hold a placeholder: put {operation_key} / {external_request_id} in the path or query"
    if "@" in parts.netloc:
        return "must not hold credentials (user:password@): name headers in LOOPWATCH_RECONCILER_HEADERS"
    if not parts.hostname:
        return "must name a host"
    return ""


@dataclass(frozen=True)
class Target:
    """Where one request goes: the URL as sent, the host for Host/SNI, the address to connect to."""

    url: str
    scheme: str
    host: str
    port: int
    path: str
    address: str


class Refused(Exception):
    """The request is not made; the message says why (it is stored as the reconciler's answer)."""


def target_for(template: str, *, operation_key: str, external_request_id: str) -> Target:
    """The request a template makes for these ids, checked, its host resolved; else Refused."""
    problem = url_template_problem(template)
    if problem:
        raise Refused(f"url_template: {problem}")
    if "{external_request_id}" in template and not external_request_id and "{operation_key}" not in template:
        raise Refused("no external_request_id to ask about")
    values = {"{operation_key}": operation_key, "{external_request_id}": external_request_id}
    url = template
    for placeholder, value in values.items():
        if placeholder in url:
            url = url.replace(placeholder, quote(value, safe=""))
    parts = urlsplit(url)
    segments = parts.path.split("/")
    for segment in segments:
        if segment.lower().replace("%2e", ".") in (".", ".."):
            raise Refused(f"{segment!r} cannot be a path segment of the request (it would leave the path)")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return Target(
        url=url,
        scheme=parts.scheme,
        host=host,
        port=port,
        path=(parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
        address=_address(host, port),
    )


def _address(host: str, port: int, *, setting: str = "LOOPWATCH_RECONCILER_ALLOWED_HOSTS") -> str:
    """The address to connect to: every address of the host must be allowed (by the list `setting`
    names), the first is used."""
    allowed = {h.lower().strip("[]") for h in getattr(settings, setting)}
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise Refused(f"host {host!r} does not resolve: {exc}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))  # an IPv6 scope id aside, str
    if not addresses:
        raise Refused(f"host {host!r} does not resolve")
    if host.lower().strip("[]") in allowed:
        return addresses[0]
    for address in addresses:
        if address.split("%")[0].lower() not in allowed and not _public(address):
            raise Refused(
                f"host {host!r} ({address}) is private, loopback or link-local: not allowed unless "
                f"{setting} names it"
            )
    return addresses[0]


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


class _PinnedHTTP(http.client.HTTPConnection):
    """Connects to the address resolved and checked before, whatever the host resolves to now."""

    def __init__(self, target: Target, timeout: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout)
        self._address = target.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, target: Target, timeout: float) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(target.host, target.port, timeout=timeout, context=self._tls)
        self._address = target.address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self.host)


def url_target(url: str, *, setting: str) -> Target:
    """A fixed URL (a notification's webhook) checked as a template's request is: http(s), no
    credentials, a host whose every address is public unless the list `setting` names it; else Refused."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise Refused("url: must be an http:// or https:// URL")
    if "@" in parts.netloc:
        raise Refused("url: must not hold credentials (user:password@)")
    if not parts.hostname:
        raise Refused("url: must name a host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise Refused("url: the port is not a number from 0 to 65535") from None
    return Target(
        url=url,
        scheme=parts.scheme,
        host=parts.hostname,
        port=port,
        path=(parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
        address=_address(parts.hostname, port, setting=setting),
    )


def downstream_fetch(
    target: Target, *, method: str, headers: dict[str, str], timeout: float, body: bytes | None = None
) -> tuple[int, bytes]:
    """(status, at most MAX_BODY_BYTES of the body); OSError/HTTPException when there is no answer.
    No redirect is followed: a 3xx is returned as it is."""
    conn_class = _PinnedHTTPS if target.scheme == "https" else _PinnedHTTP
    conn = conn_class(target, timeout)
    try:
        conn.request(method, target.path, body=body, headers={"Accept": "application/json", **headers})
        response = conn.getresponse()
        return response.status, response.read(MAX_BODY_BYTES)
    finally:
        conn.close()


def value_at(body: Any, path: str) -> Any:
    value = body
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def kept(body: Any, paths: list[str]) -> dict[str, Any]:
    """The declared fields of a downstream's answer, by dotted path; a big one says it was left out."""
    out: dict[str, Any] = {}
    for path in paths:
        value = value_at(body, path)
        size = len(orjson.dumps(value))
        out[path] = value if size <= MAX_KEPT_BYTES else f"(left out: {size} bytes)"
    return out
