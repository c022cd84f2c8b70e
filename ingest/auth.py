"""Bearer API keys for DRF views and WebSocket consumers."""

from __future__ import annotations

import time

from django.conf import settings
from django.utils import timezone
from rest_framework import authentication, exceptions, permissions

from ingest.models import ApiKey
from ingest.services import api_key_hash

# last_used_at is written at most this often per key, not on every request.
LAST_USED_RESOLUTION_S = 60


# Active keys a process looked up lately: hash -> (valid until, key). Unknown and revoked keys are
# never cached, so a new key works at once and a bad one is looked up (and refused) every time.
_cache: dict[str, tuple[float, ApiKey]] = {}
_CACHE_MAX = 10_000


def api_key_lookup(raw: str) -> ApiKey | None:
    """The active key for a raw bearer token, or None."""
    if not raw or len(raw) > 200:
        return None
    digest = api_key_hash(raw)
    hit = _cache.get(digest)
    if hit is not None and hit[0] > time.monotonic():
        return hit[1]
    key = ApiKey.objects.select_related("tenant").filter(key_hash=digest).first()
    if key is None or key.revoked_at is not None:
        _cache.pop(digest, None)
        return None
    now = timezone.now()
    if key.last_used_at is None or (now - key.last_used_at).total_seconds() > LAST_USED_RESOLUTION_S:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    ttl = settings.LOOPWATCH_KEY_CACHE_S
    if ttl > 0:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[digest] = (time.monotonic() + ttl, key)
    return key


def api_key_forget(key_hash: str) -> None:
    """Drop a key from this process's cache (revoking calls it)."""
    _cache.pop(key_hash, None)


def api_key_cached(raw: str) -> bool:
    """Whether this process holds the key as active in its cache: no database, for the event loop."""
    hit = _cache.get(api_key_hash(raw)) if raw and len(raw) <= 200 else None
    return hit is not None and hit[0] > time.monotonic()


def bearer_token(header: str) -> str | None:
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None
    return parts[1]


class ApiClient:
    """request.user for API calls: the key's tenant speaking through the key."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, key: ApiKey) -> None:
        self.key = key
        self.tenant = key.tenant

    def __str__(self) -> str:
        return f"api-key:{self.key.prefix}"


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <key>`; request.auth is the ApiKey, request.user an ApiClient."""

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        raw = bearer_token(header)
        if raw is None:
            raise exceptions.AuthenticationFailed("Authorization: expected 'Bearer <api key>'")
        key = api_key_lookup(raw)
        if key is None:
            raise exceptions.AuthenticationFailed("Authorization: unknown or revoked API key")
        return (ApiClient(key), key)

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="loopwatch"'


class ApiKeyRequired(permissions.BasePermission):
    """What every permission that needs an API key derives from. The ASGI handler reads it off the
    view: a request to such a view without a valid key is answered before its body is read."""


def key_required(view_class: type | None) -> bool:
    return any(
        isinstance(permission, type) and issubclass(permission, ApiKeyRequired)
        for permission in getattr(view_class, "permission_classes", ())
    )


def scope_permission(scope: str) -> type[permissions.BasePermission]:
    scope = str(scope.value if hasattr(scope, "value") else scope)

    class HasScope(ApiKeyRequired):
        message = f"Authorization: this API key lacks the {scope!r} scope"

        def has_permission(self, request, view) -> bool:
            if not isinstance(request.auth, ApiKey):
                raise exceptions.NotAuthenticated("Authorization: send 'Authorization: Bearer <api key>'")
            return scope in request.auth.scopes

    HasScope.__name__ = f"Has{scope.title()}Scope"
    return HasScope


HasIngestScope = scope_permission(ApiKey.Scope.INGEST)
HasReadScope = scope_permission(ApiKey.Scope.READ)
HasLedgerScope = scope_permission(ApiKey.Scope.LEDGER)
HasOperateScope = scope_permission(ApiKey.Scope.OPERATE)
