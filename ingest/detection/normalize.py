"""Canonical forms of arguments and results: what makes two calls "the same".

Keys are sorted at every depth; noise (timestamps, request/trace/span ids, nonces, UUIDs under
id-like keys) is dropped; numbers are rounded to a fixed precision; strings are trimmed and their
whitespace collapsed (and case-folded when the tool says so).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson

NUMBER_DIGITS = 6  # 0.1 + 0.2 and 0.3 are the same argument
NOISE_KEYS = frozenset(
    {
        "timestamp",
        "ts",
        "time",
        "now",
        "date_now",
        "request_id",
        "requestid",
        "req_id",
        "trace_id",
        "traceid",
        "span_id",
        "spanid",
        "parent_span_id",
        "correlation_id",
        "idempotency_nonce",
        "nonce",
        "cache_buster",
        "cachebuster",
        "_",
        "rand",
        "random",
        "seed_nonce",
        "client_ts",
        "sent_at",
        "generated_at",
        "retrieved_at",
        "fetched_at",
        "elapsed_ms",
        "latency_ms",
        "duration_ms",
        "took",
        "took_ms",
        "server_time",
        "as_of",
        "asof",
        "checked_at",
        "observed_at",
        "updated",
        "last_updated",
        "etag",
    }
)
CURSOR_KEYS = frozenset(
    {"page", "offset", "cursor", "start", "after", "since", "page_token", "next_token", "from"}
)
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")
_ISO_TS = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?([Zz]|[+-]\d{2}:?\d{2})?$")
_PUNCTUATION = re.compile(r"[^\w\s?]")
MAX_DEPTH = 12  # deeper structures are hashed whole
MAX_FACTS = 200  # scalar leaves of one result taken as facts
# Fuzzy matching (rapidfuzz's ratios, quadratic in length) sees at most about this much of a text: a
# 240 KB argument cost 2.8 s a comparison, this costs microseconds (fuzzy_view).
FUZZY_CHARS = 512


def _id_like(key: str) -> bool:
    return key == "id" or key.endswith(("_id", "id", "_uuid", "uuid", "_key"))


def is_noise(key: str, value: Any, extra: tuple[str, ...] = ()) -> bool:
    lowered = key.lower()
    if lowered in NOISE_KEYS or key in extra:
        return True
    if isinstance(value, str):
        if _id_like(lowered) and _UUID.match(value):
            return True
        if lowered.endswith(("_at", "_time", "_ts")) and _ISO_TS.match(value):
            return True
    return False


def canonical(value: Any, *, casefold: bool = False, noise: tuple[str, ...] = (), depth: int = 0) -> Any:
    """A JSON-able value with keys sorted, noise dropped, numbers rounded, strings tidied."""
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return digest(value)
        return {
            str(k): canonical(v, casefold=casefold, noise=noise, depth=depth + 1)
            for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
            if not is_noise(str(k), v, noise)
        }
    if isinstance(value, list):
        if depth >= MAX_DEPTH:
            return digest(value)
        return [canonical(v, casefold=casefold, noise=noise, depth=depth + 1) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        rounded = round(value, NUMBER_DIGITS)
        # 3.0 is the argument 3; 1e300 stays a float (as an int it has 301 digits: orjson refuses it).
        return int(rounded) if rounded.is_integer() and -(2**63) <= rounded < 2**63 else rounded
    if isinstance(value, str):
        # Whitespace runs collapsed: str.split() splits on what \s matches, several times faster
        # than the regular expression on a long value (a 240 KB argument: 15 ms against 4).
        text = " ".join(value.split())
        return text.casefold() if casefold else text
    return str(value)


def digest(value: Any) -> str:
    """A short stable hash of a JSON-able value (64 bits: collisions do not matter at run scale)."""
    raw = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


def split_cursor(args: dict[str, Any], cursor_keys: frozenset[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the arguments without cursor fields, the cursor fields)."""
    rest: dict[str, Any] = {}
    cursor: dict[str, Any] = {}
    for key, value in args.items():
        (cursor if key.lower() in cursor_keys else rest)[key] = value
    return rest, cursor


# Result fields that echo the request's paging: no information about the world.
ECHO_KEYS = CURSOR_KEYS | {
    "limit",
    "page_size",
    "per_page",
    "has_more",
    "next",
    "next_cursor",
    "next_page",
    "next_page_token",
    "prev",
    "previous",
    "returned",
}


def result_facts(value: Any) -> list[str]:
    """Scalar leaves of a result as short hashes of (path without list indices, value).

    Paths leave list positions out, so the same items in another order are no new fact.
    """
    facts: list[str] = []
    _walk(value, "", facts)
    return facts


def _walk(value: Any, path: str, out: list[str]) -> None:
    if len(out) >= MAX_FACTS:
        return
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            if not is_noise(str(key), value[key]) and str(key).lower() not in ECHO_KEYS:
                _walk(value[key], f"{path}.{key}", out)
    elif isinstance(value, list):
        for item in value:
            _walk(item, f"{path}[]", out)
    elif value is not None and value != "":
        scalar = canonical(value)
        if isinstance(scalar, str) and len(scalar) > 200:
            # Long text: each sentence-ish chunk is a fact, so a page that only adds a line is new.
            for chunk in scalar.split(". "):
                if chunk:
                    out.append(hashlib.blake2b(f"{path}={chunk}".encode(), digest_size=6).hexdigest())
            return
        out.append(hashlib.blake2b(f"{path}={scalar}".encode(), digest_size=6).hexdigest())


def fuzzy_view(text: str) -> str:
    """What fuzzy matching compares of a text: the text itself when it is at most FUZZY_CHARS long;
    else its first and last FUZZY_CHARS // 2 characters around a hash of the whole, so that two long
    texts alike at both ends score as nearly (not exactly) the same, and equal ones are found equal
    before any of this (an == comparison, linear)."""
    if len(text) <= FUZZY_CHARS:
        return text
    half = FUZZY_CHARS // 2
    mark = hashlib.blake2b(text.encode(errors="surrogatepass"), digest_size=8).hexdigest()
    return f"{text[:half]} {mark} {text[-half:]}"


def text_key(text: str) -> str:
    """Model or user text reduced for comparison: lower case, punctuation and extra spaces gone."""
    return " ".join(_PUNCTUATION.sub(" ", text.casefold()).split())
