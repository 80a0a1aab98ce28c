"""The one way out to a URL a user gave us.

Tool executors, MCP servers and workflow callbacks are URLs that API users
type in, and the engine calls them from inside our network. Without a guard
that is server-side request forgery: a user could point a tool at
``http://169.254.169.254/`` (cloud metadata, which hands out credentials), at
``http://localhost:5432/`` or at anything else on the private network, and
read the answer back in their result file.

The guard has three layers:

* ``check_url`` rejects what is wrong before any I/O: schemes other than
  http(s), credentials in the URL, IP literals in blocked ranges, brackets
  that hold no IPv6 literal, and host labels that are not valid IDNA.
  aiohttp never calls the resolver for an IP literal, so this is the only
  place literals are checked.
* ``GuardedResolver`` checks every address a host name resolves to. aiohttp
  connects to exactly the addresses the resolver returned, so a name cannot
  pass the check with a public address and then connect to a private one
  (DNS rebinding): there is no second lookup to rebind.
* Redirects are never followed (a 302 to the metadata endpoint would bypass
  both checks), response bodies are capped while streaming, and the session
  keeps no cookies and ignores proxy environment variables.

Messages in ``OutboundError`` end up in result files, so they name only the
origin (scheme, host, port): never a path, query, header or credential.
Every refusal of a host (a blocked literal, a name resolving to a blocked
address, a name that does not resolve, a numeric or zone-id trick) is one
``BlockedHost`` with one message: different words would tell a tenant which
internal names exist.
``OPENRELAY_ALLOW_PRIVATE_URLS`` turns the address checks off for local
development and tests; the scheme, credential and redirect rules stay.

One client serves every organization on an engine, so what one organization's
servers hold must not be what another's calls wait for. ``Slots`` bounds the
calls in flight per tenant (an organization) and per host, and a call takes its
slots before its clock starts: its ``timeout_s`` counts from when it is sent,
and a wait for a slot that outlasts its own bound is an error of its own
(kind ``busy``), never the server's timeout.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import socket
from collections.abc import AsyncIterator, Hashable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import aiohttp
import orjson
from aiohttp.abc import AbstractResolver, ResolveResult
from multidict import CIMultiDict
from yarl import URL

__all__ = [
    "BlockedHost",
    "BlockedURL",
    "GuardedResolver",
    "OutboundClient",
    "OutboundError",
    "OutboundResponse",
    "Slots",
    "check_url",
    "is_blocked_address",
    "redact_headers",
]

Kind = Literal["blocked", "invalid", "timeout", "transport", "too_large", "malformed", "busy"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

DEFAULT_MAX_RESPONSE_BYTES = 10 * 1024 * 1024
# The defaults of OPENRELAY_OUTBOUND_PER_ORGANIZATION, _PER_HOST and _SLOT_WAIT_S (settings.py).
DEFAULT_PER_TENANT = 32
DEFAULT_PER_HOST = 64
DEFAULT_SLOT_WAIT_S = 300.0
USER_AGENT = "OpenRelay-Batch"
_CHUNK = 64 * 1024


class OutboundError(Exception):
    """A call to a user URL failed; ``str(exc)`` is safe for a result file."""

    def __init__(self, message: str, *, kind: Kind) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class BlockedURL(OutboundError):
    """The URL, or an address its host resolves to, is not allowed."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="blocked")


HOST_REFUSED = "the host is not allowed (a private, loopback, link-local or reserved address) or does not resolve"


class BlockedHost(BlockedURL):
    """The host may not be called, for whatever reason: always the same words after the origin."""

    def __init__(self, origin: str = "") -> None:
        super().__init__(f"{origin}: {HOST_REFUSED}" if origin else HOST_REFUSED)


# --- addresses -------------------------------------------------------------

# Written out rather than left to ipaddress' is_private/is_global alone: those
# flags have changed between Python patch releases, and this list is the
# policy we test. ``not is_global`` is still applied on top as a backstop.
_BLOCKED_V4 = tuple(
    ipaddress.IPv4Network(net)
    for net in (
        "0.0.0.0/8",  # "this network"; 0.0.0.0 reaches localhost on Linux
        "10.0.0.0/8",  # RFC 1918
        "100.64.0.0/10",  # CGNAT, also Alibaba metadata 100.100.100.200
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local, AWS/GCP/Azure metadata 169.254.169.254
        "172.16.0.0/12",  # RFC 1918
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # documentation (TEST-NET-1)
        "192.88.99.0/24",  # deprecated 6to4 relay anycast
        "192.168.0.0/16",  # RFC 1918
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation (TEST-NET-2)
        "203.0.113.0/24",  # documentation (TEST-NET-3)
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, includes broadcast 255.255.255.255
    )
)

_BLOCKED_V6 = tuple(
    ipaddress.IPv6Network(net)
    for net in (
        "::/8",  # unspecified, loopback, IPv4-compatible, SIIT, local NAT64
        "100::/64",  # discard-only
        "2001::/23",  # IETF protocol assignments (Teredo, ORCHID, benchmarking)
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation (RFC 9637)
        "fc00::/7",  # unique local, includes AWS metadata fd00:ec2::254
        "fe80::/10",  # link-local
        "fec0::/10",  # deprecated site-local
        "ff00::/8",  # multicast
    )
)

# IPv6 forms that carry an IPv4 address inside; they are judged by that
# address, so ::ffff:127.0.0.1 is loopback but 64:ff9b::8.8.8.8 is public.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _parse_address(ip: str | IPAddress) -> IPAddress:
    if isinstance(ip, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return ip
    return ipaddress.ip_address(ip.strip("[]"))


def _embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr in _NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return addr.sixtofour  # 2002::/16, None otherwise


def is_blocked_address(ip: str | IPAddress) -> bool:
    """True when ``ip`` must not be connected to from a user URL.

    Anything that does not parse as an address counts as blocked: the
    callers only ever pass addresses, so garbage means someone is probing.
    """
    try:
        addr = _parse_address(ip)
    except ValueError:
        return True
    if isinstance(addr, ipaddress.IPv6Address):
        # Drop the zone id (fe80::1%eth0): it does not change the range, and
        # Python 3.11's .exploded chokes on it.
        addr = ipaddress.IPv6Address(int(addr))
        embedded = _embedded_ipv4(addr)
        if embedded is not None:
            return is_blocked_address(embedded)
        return any(addr in net for net in _BLOCKED_V6) or not addr.is_global
    return any(addr in net for net in _BLOCKED_V4) or not addr.is_global


# --- URLs ------------------------------------------------------------------

# Hosts made only of numeric labels (decimal, octal, hex) are legacy IPv4
# spellings: http://2130706433/ and http://0x7f.1/ both mean 127.0.0.1 to
# getaddrinfo. yarl keeps them verbatim; aiohttp 3.14 refuses the all-digit
# ones itself but hands hex ones to the resolver. Refused here outright, with
# or without allow_private, so the behaviour does not hang on either library.
_NUMERIC_HOST = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)(?:\.(?:0x[0-9a-f]*|[0-9]+))*\.?", re.I)


def _origin(url: URL) -> str:
    """scheme://host[:port] with nothing else: safe for messages."""
    try:
        return str(url.origin())
    except ValueError:
        return "<invalid URL>"


def _check_host(host: str, origin: str, *, allow_private: bool) -> None:
    if "%" in host:
        # Either an IPv6 zone id (fe80::1%eth0: link-local only, and aiohttp
        # cannot connect to one) or percent-encoding no DNS name contains.
        raise BlockedHost(origin)
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        if _NUMERIC_HOST.fullmatch(host):
            raise BlockedHost(origin) from None  # a legacy IPv4 spelling (not dotted-quad)
        if ":" in host:
            # Brackets that hold no IPv6 literal ("http://[name:with.colon]/"): yarl keeps the
            # text as the host, and aiohttp takes a host with a colon for an address literal, so
            # it never asks the resolver, and getaddrinfo found the name in a hosts file and
            # connected to loopback past the guard. No DNS name has a colon: refused always.
            raise BlockedHost(origin) from None
        return  # a name: the resolver checks what it resolves to
    if not allow_private and is_blocked_address(addr):
        raise BlockedHost(origin)


def check_url(url: str | URL, *, allow_private: bool) -> URL:
    """Parse ``url`` and refuse it if it may not be called; no I/O."""
    try:
        parsed = url if isinstance(url, URL) else URL(url)
    except (ValueError, TypeError):
        raise BlockedURL("not a valid URL") from None
    if not parsed.scheme:
        raise BlockedURL("URL has no scheme; use http:// or https://")
    if parsed.scheme not in ("http", "https"):
        raise BlockedURL(f"URL scheme {parsed.scheme!r} is not allowed; use http or https")
    if not parsed.raw_host:
        raise BlockedURL("URL has no host")
    # An empty "http://@host" is dropped by yarl and sends nothing; any
    # user or password at all (even "http://:@host") is refused.
    if parsed.raw_user is not None or parsed.raw_password is not None:
        raise BlockedURL("URL must not contain credentials (user:password@)")
    try:
        host = parsed.host or parsed.raw_host
    except ValueError:  # UnicodeError: a label "xn--" that is not valid punycode (xn--zz.com)
        raise BlockedURL("URL host is not a valid internationalized (IDNA) name") from None
    _check_host(host, _origin(parsed), allow_private=allow_private)
    return parsed


# --- resolver --------------------------------------------------------------


class GuardedResolver(AbstractResolver):
    """Resolve with an inner resolver, refusing hosts with blocked addresses.

    One blocked address refuses the whole host: otherwise a name listing a
    public and a private address would reach the private one whenever the
    connector fell back to it.
    """

    def __init__(self, *, allow_private: bool, inner: AbstractResolver | None = None) -> None:
        # ThreadedResolver needs the running loop, hence construction in
        # OutboundClient.__aenter__ rather than at import time.
        self._inner = inner if inner is not None else aiohttp.ThreadedResolver()
        self._allow_private = allow_private

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        if self._allow_private:
            return results
        if any(is_blocked_address(r["host"]) for r in results):
            # Neither the address nor this reason is said: it would let users
            # map internal DNS names through their result files.
            raise BlockedHost()
        return results

    async def close(self) -> None:
        await self._inner.close()


# --- responses and headers -------------------------------------------------

_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie", "set-cookie"})


def redact_headers(
    headers: Mapping[str, str] | Iterable[tuple[str, str]] | None,
) -> dict[str, str]:
    """A copy of ``headers`` fit for a log line: secret values replaced."""
    if headers is None:
        return {}
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    return {name: "[redacted]" if name.lower() in _SECRET_HEADERS else value for name, value in pairs}


@dataclass(frozen=True)
class OutboundResponse:
    status: int
    headers: dict[str, str]  # lower-case names; repeated headers joined by ", "
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            raise OutboundError("response body is not valid JSON", kind="malformed") from None


def _lower_headers(headers: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in headers.items():
        key = name.lower()
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


# --- client ----------------------------------------------------------------


def _allow_private_setting() -> bool:
    # Imported here so the module works without Django (engine tests, CLI).
    try:
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured
    except ImportError:
        return False
    try:
        return bool(getattr(settings, "OPENRELAY_ALLOW_PRIVATE_URLS", False))
    except ImproperlyConfigured:
        return False


_Number = TypeVar("_Number", int, float)


def _limit_setting(name: str, default: _Number) -> _Number:
    """A limit from Django's settings, or ``default`` without Django (like _allow_private_setting)."""
    try:
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured
    except ImportError:
        return default
    try:
        return type(default)(getattr(settings, name, default))
    except ImproperlyConfigured:
        return default


# Header names are RFC 9110 tokens; values may not break the header line.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(r"[\r\n\x00]")


def valid_header(name: str, value: str) -> bool:
    """A header HTTP allows: a token name, and a value that can't break the header line."""
    return bool(_TOKEN.fullmatch(name)) and not _BAD_VALUE.search(value)


def _request_headers(headers: Mapping[str, str] | None, accept: str, *, has_body: bool = True) -> CIMultiDict[str]:
    merged: CIMultiDict[str] = CIMultiDict({"Accept": accept, "User-Agent": USER_AGENT})
    if has_body:
        merged["Content-Type"] = "application/json"
    for name, value in (headers or {}).items():
        # Checked here so the error names the header but never its value
        # (aiohttp's own ValueError would quote the value).
        if not valid_header(name, str(value)):
            raise OutboundError(f"request header {name!r} is not valid", kind="invalid")
        merged[name] = str(value)
    return merged


def _transport_error(origin: str, exc: BaseException) -> OutboundError:
    # Our own wording: str() of some aiohttp errors quotes the full URL.
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        # Said as a blocked host is: "does not resolve" against "private" would map internal names.
        return BlockedHost(origin)
    if isinstance(exc, aiohttp.ClientSSLError):
        return OutboundError(f"{origin}: TLS handshake failed", kind="transport")
    if isinstance(exc, aiohttp.ClientConnectorError):
        # strerror quotes the peer address; the errno text is enough.
        reason = os.strerror(exc.errno) if exc.errno else type(exc.os_error).__name__
        return OutboundError(f"{origin}: could not connect ({reason})", kind="transport")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return OutboundError(f"{origin}: server closed the connection", kind="transport")
    return OutboundError(f"{origin}: request failed ({type(exc).__name__})", kind="transport")


class _Semaphores:
    """A semaphore of ``limit`` per key, made on first use and dropped once no call holds or
    waits for it: an engine meets new hosts for as long as it runs."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what  # whose slots, for the message when none comes free
        self._semaphores: dict[Hashable, asyncio.Semaphore] = {}
        self._users: dict[Hashable, int] = {}

    async def acquire(self, key: Hashable) -> None:
        semaphore = self._semaphores.get(key)
        if semaphore is None:
            semaphore = self._semaphores[key] = asyncio.Semaphore(self.limit)
        self._users[key] = self._users.get(key, 0) + 1
        try:
            await semaphore.acquire()
        except BaseException:
            self._leave(key)
            raise

    def release(self, key: Hashable) -> None:
        self._semaphores[key].release()
        self._leave(key)

    def _leave(self, key: Hashable) -> None:
        users = self._users[key] - 1
        if users:
            self._users[key] = users
        else:
            del self._users[key], self._semaphores[key]


class Slots:
    """Calls in flight through one client: at most ``per_tenant`` of one tenant, ``per_host`` to one origin.

    A call takes its tenant's slot, then its origin's, before its timeout
    starts. These are the limits because aiohttp's own (the connector's
    ``limit`` and ``limit_per_host``) wait inside the request, so inside the
    caller's timeout: with one limit of 100 for every organization, one
    organization's 160 hanging MCP calls filled it and another's 5 tool calls
    timed out after 5 s without being sent (issue 42). The connector is
    unlimited; the per-tenant slots keep any one tenant to its share, and a
    per-host limit above them means no tenant fills a host alone.
    """

    def __init__(self, *, per_tenant: int, per_host: int) -> None:
        self.tenants = _Semaphores(per_tenant, "the organization's {n} outbound slots on this engine")
        self.hosts = _Semaphores(per_host, "this engine's {n} connections to the host")

    @asynccontextmanager
    async def hold(self, tenant: Hashable | None, origin: str, wait_s: float) -> AsyncIterator[None]:
        """Hold a slot of ``tenant`` (None: no tenant limit) and of ``origin`` while the block runs.

        Raises OutboundError(kind="busy") when they don't come free within ``wait_s``.
        """
        held: list[tuple[_Semaphores, Hashable]] = []
        try:
            waiting = self.tenants
            try:
                async with asyncio.timeout(wait_s):
                    for waiting, key in ((self.tenants, tenant), (self.hosts, origin)):
                        if key is not None:
                            await waiting.acquire(key)
                            held.append((waiting, key))
            except TimeoutError:
                whose = waiting.what.format(n=waiting.limit)
                message = f"{origin}: not sent: none of {whose} came free within {wait_s:g}s"
                raise OutboundError(message, kind="busy") from None
            yield
        finally:
            for semaphores, key in reversed(held):
                semaphores.release(key)


class OutboundClient:
    """One aiohttp session for user URLs, per event loop.

    Use as ``async with OutboundClient() as client:`` inside the loop that
    will make the calls; the session and its resolver belong to that loop.
    """

    def __init__(
        self,
        *,
        allow_private: bool | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        per_tenant: int | None = None,
        per_host: int | None = None,
        slot_wait_s: float | None = None,
    ) -> None:
        if allow_private is None:
            allow_private = _allow_private_setting()
        self.allow_private = allow_private
        self.max_response_bytes = max_response_bytes
        # Limits not given come from settings (OPENRELAY_OUTBOUND_*), as allow_private does.
        self.slots = Slots(
            per_tenant=per_tenant or _limit_setting("OPENRELAY_OUTBOUND_PER_ORGANIZATION", DEFAULT_PER_TENANT),
            per_host=per_host or _limit_setting("OPENRELAY_OUTBOUND_PER_HOST", DEFAULT_PER_HOST),
        )
        self.slot_wait_s = slot_wait_s or _limit_setting("OPENRELAY_OUTBOUND_SLOT_WAIT_S", DEFAULT_SLOT_WAIT_S)
        self._session: aiohttp.ClientSession | None = None
        self._resolver: GuardedResolver | None = None

    async def __aenter__(self) -> OutboundClient:
        self._resolver = GuardedResolver(allow_private=self.allow_private)
        # No limits here: Slots are the limits, taken before a call's clock starts.
        connector = aiohttp.TCPConnector(resolver=self._resolver, limit=0, limit_per_host=0)
        self._session = aiohttp.ClientSession(
            connector=connector,
            # HTTP(S)_PROXY would make aiohttp resolve the proxy, not the
            # target, and skip the guard; user URLs always go direct.
            trust_env=False,
            # One session serves every organization: a cookie set by one
            # user's server must never be sent on another user's call.
            cookie_jar=aiohttp.DummyCookieJar(),
            # Deadlines are per call, see post_json.
            timeout=aiohttp.ClientTimeout(total=None),
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()
        if self._resolver is not None:
            # A resolver passed in is not the connector's to close.
            await self._resolver.close()
        self._session = self._resolver = None

    async def post_json(
        self,
        url: str | URL,
        payload: Any,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float,
        accept: str = "application/json",
        tenant: Hashable | None = None,
        slot_wait_s: float | None = None,
    ) -> OutboundResponse:
        """POST ``payload`` as JSON; any status comes back, 3xx included.

        Raises OutboundError with kind blocked, invalid, timeout, transport,
        too_large or busy. ``timeout_s`` bounds the call once its slots are
        held (Slots; ``tenant`` is whose they are, an organization, or None):
        resolving, connecting, sending and reading the body. The wait for the
        slots is bounded by ``slot_wait_s`` (the client's by default) instead.
        """
        return await self._request("POST", url, _serialize(payload), headers, timeout_s, accept, tenant, slot_wait_s)

    async def post_raw(
        self,
        url: str | URL,
        body: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float,
        accept: str = "application/json",
        tenant: Hashable | None = None,
        slot_wait_s: float | None = None,
    ) -> OutboundResponse:
        """POST JSON text that is already bytes (it was signed as such), like post_json."""
        return await self._request("POST", url, body, headers, timeout_s, accept, tenant, slot_wait_s)

    async def delete(
        self,
        url: str | URL,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float,
        accept: str = "application/json",
        tenant: Hashable | None = None,
        slot_wait_s: float | None = None,
    ) -> OutboundResponse:
        """DELETE ``url`` (no body), under the same guard, limits and errors as post_json."""
        return await self._request("DELETE", url, None, headers, timeout_s, accept, tenant, slot_wait_s)

    async def _request(
        self,
        method: str,
        url: str | URL,
        body: bytes | None,
        headers: Mapping[str, str] | None,
        timeout_s: float,
        accept: str,
        tenant: Hashable | None,
        slot_wait_s: float | None,
    ) -> OutboundResponse:
        if self._session is None:
            raise RuntimeError("OutboundClient is used outside 'async with'")
        target = check_url(url, allow_private=self.allow_private)
        origin = _origin(target)
        request_headers = _request_headers(headers, accept, has_body=body is not None)
        wait_s = self.slot_wait_s if slot_wait_s is None else slot_wait_s
        async with self.slots.hold(tenant, origin, wait_s):
            return await self._timed(method, target, body, request_headers, origin, timeout_s)

    async def _timed(
        self, method: str, target: URL, body: bytes | None, headers: CIMultiDict[str], origin: str, timeout_s: float
    ) -> OutboundResponse:
        """One call under ``timeout_s``, its slots already held: the clock starts here."""
        try:
            async with asyncio.timeout(timeout_s):
                return await self._send(method, target, body, headers, origin)
        except BlockedHost:
            raise BlockedHost(origin) from None  # the resolver knows no origin
        except OutboundError:
            raise
        except TimeoutError:
            raise OutboundError(f"{origin}: timed out after {timeout_s:g}s", kind="timeout") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise _transport_error(origin, exc) from None

    async def _send(
        self, method: str, url: URL, body: bytes | None, headers: CIMultiDict[str], origin: str
    ) -> OutboundResponse:
        assert self._session is not None
        async with self._session.request(method, url, data=body, headers=headers, allow_redirects=False) as resp:
            content = await self._read_capped(resp, origin)
            return OutboundResponse(status=resp.status, headers=_lower_headers(resp.headers), body=content)

    async def _read_capped(self, resp: aiohttp.ClientResponse, origin: str) -> bytes:
        cap = self.max_response_bytes
        if resp.content_length is not None and resp.content_length > cap:
            resp.close()
            raise _too_large(origin, cap)
        chunks: list[bytes] = []
        size = 0
        # Counted after decompression, so a small gzip bomb is caught too.
        async for chunk in resp.content.iter_chunked(_CHUNK):
            size += len(chunk)
            if size > cap:
                # Drop the connection: the rest of the body is never read,
                # so it cannot go back to the pool.
                resp.close()
                raise _too_large(origin, cap)
            chunks.append(chunk)
        return b"".join(chunks)


def _too_large(origin: str, cap: int) -> OutboundError:
    return OutboundError(f"{origin}: response body exceeds the {cap} byte limit", kind="too_large")


def _serialize(payload: Any) -> bytes:
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError:
        # e.g. an integer beyond 64 bits in user data: a per-request error,
        # not a crash of the whole batch.
        raise OutboundError("request payload cannot be serialized as JSON", kind="invalid") from None
