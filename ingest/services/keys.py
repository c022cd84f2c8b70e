"""Tenants and API keys: create, hash and revoke keys, and the per-process cache of active keys
that authentication looks them up in."""

from __future__ import annotations

import hashlib
import secrets
import time

from django.conf import settings
from django.utils import timezone

from ingest.models import (
    ApiKey,
    Tenant,
)

KEY_PREFIX = "lw_"


def tenant_get_or_create(*, slug: str, name: str = "") -> Tenant:
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    return tenant


def api_key_hash(raw: str) -> str:
    # Keys are 256-bit random tokens, so a plain sha256 is enough (no password stretching needed).
    return hashlib.sha256(raw.encode()).hexdigest()


def api_key_create(*, tenant: Tenant, scopes: list[str], name: str = "") -> tuple[ApiKey, str]:
    """Create a key; the raw key is returned once and never stored."""
    unknown = set(scopes) - set(ApiKey.Scope.values)
    if unknown or not scopes:
        raise ValueError(f"scopes must be a non-empty subset of {', '.join(ApiKey.Scope.values)}")
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        tenant=tenant, name=name, prefix=raw[:10], key_hash=api_key_hash(raw), scopes=sorted(set(scopes))
    )
    return key, raw


def api_key_revoke(*, key: ApiKey) -> ApiKey:
    """Revoke at once in this process; other server processes stop accepting it within
    LOOPWATCH_KEY_CACHE_S seconds."""
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    api_key_forget(key.key_hash)
    return key


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
