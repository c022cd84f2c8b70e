"""Bearer API keys for DRF views and WebSocket consumers."""

from __future__ import annotations

from rest_framework import authentication, exceptions, permissions

from ingest.models import ApiKey
from ingest.services.keys import api_key_lookup


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
