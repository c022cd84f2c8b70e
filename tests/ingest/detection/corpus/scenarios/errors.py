"""Loops: repeated errors — the same failing call retried unchanged, or retried past the retry quota."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.ingest.detection.corpus.builder import RETRY_QUOTA, Run, loop

RETRYABLE = ("transient", "rate_limited")


def _fail_repeat(
    r: Run,
    tool: str,
    args: dict[str, Any] | Callable[[Run], dict[str, Any]],
    error: Any,
    *,
    error_class: str,
    attempts: int,
    gap: tuple[float, float] | None = None,
    texts: dict[int, str] | None = None,
) -> None:
    """The same call failing the same way `attempts` times (`args` may draw fresh noise per call).

    The label point is the 2nd identical failure, or for a retryable class the attempt after the
    retry quota is spent (RETRY_QUOTA + 2). An empty result comes back with status ok.
    """
    label_at = RETRY_QUOTA + 2 if error_class in RETRYABLE else 2
    status = "ok" if error_class == "empty_result" else "error"
    calls = ((tool, args(r) if callable(args) else args, error) for _ in range(attempts))
    r.steps(calls, label_at=label_at, texts=texts, wait=gap or 0.0, status=status, error_class=error_class)


@loop("repeated_error", "repeat_invalid_argument", "support-bot", "order_lookup", "gpt-4o")
def loop_error_invalid_argument(r: Run) -> None:
    """get_order with an id missing its 'A-' prefix is rejected as invalid_argument; retried unchanged."""
    r.user("Order 20931 — can you tell me when it ships?")
    _fail_repeat(
        r,
        "get_order",
        {"order_id": "20931"},
        {"error": "invalid order_id '20931': must match ^A-\\d{5}$"},
        error_class="invalid_argument",
        attempts=6,
        texts={1: "Let me look that order up.", 2: "Let me try that again."},
    )
    r.finish("failed", terminated_by="error", reason="invalid_argument repeated")


@loop("repeated_error", "repeat_not_found", "code-fixer", "coding", "claude-sonnet-4-5")
def loop_error_not_found_file(r: Run) -> None:
    """Coding agent keeps reading a file that the directory listing showed does not exist."""
    r.user("Add type hints to the helpers in src/utils/helpers.py.")
    r.step(
        "list_dir",
        {"path": "src/utils"},
        {"entries": ["__init__.py", "dates.py", "strings.py"]},
        text="Let me look at the utils package.",
    )
    _fail_repeat(
        r,
        "read_file",
        {"path": "src/utils/helpers.py"},
        {"error": "No such file or directory: 'src/utils/helpers.py'"},
        error_class="not_found",
        attempts=5,
    )
    r.finish("failed", terminated_by="error")


@loop("repeated_error", "rate_limited_beyond_quota", "repo-analyst", "research", "deepseek-chat")
def loop_error_rate_limited_no_backoff(r: Run) -> None:
    """GitHub API says rate limited (retry after 60s); the agent retries 7 times within seconds."""
    r.user("How many open issues labelled 'bug' does octo-org/widgets have?")
    _fail_repeat(
        r,
        "http_get",
        {
            "url": "https://api.github.example.com/repos/octo-org/widgets/issues?labels=bug"
            "&state=open&per_page=100"
        },
        {"status": 429, "message": "API rate limit exceeded", "retry_after_s": 60},
        error_class="rate_limited",
        attempts=8,
        gap=(0.2, 0.9),
    )
    r.finish("failed", terminated_by="error")


@loop("repeated_error", "repeat_permission_denied", "sql-analyst", "analytics", "llama-3.1-70b-instruct")
def loop_error_permission(r: Run) -> None:
    """Analyst agent re-runs a query on a table it has no grant for; the same permission error 5 times."""
    r.user("What's the average salary per department?")
    _fail_repeat(
        r,
        "sql_query",
        {
            "sql": "SELECT department, avg(salary) FROM hr.salaries GROUP BY department",
            "database": "warehouse",
        },
        {"error": "permission denied for schema hr", "sqlstate": "42501"},
        error_class="permission",
        attempts=5,
    )
    r.finish("failed")


@loop("repeated_error", "repeat_parse_error", "sql-analyst", "analytics", "gpt-4.1-mini")
def loop_error_parse_error(r: Run) -> None:
    """The same misspelt SQL (SELEC) fails with a syntax error five times."""
    r.user("List the 10 customers with the highest lifetime spend.")
    _fail_repeat(
        r,
        "sql_query",
        {
            "sql": "SELEC c.name, sum(o.total) AS spend FROM customers c JOIN orders o "
            "ON o.customer_id = c.id GROUP BY c.name ORDER BY spend DESC LIMIT 10"
        },
        {"error": 'syntax error at or near "SELEC"', "position": 1},
        error_class="parse_error",
        attempts=5,
        texts={2: "Let me run the query again."},
    )
    r.finish("failed")


@loop("repeated_error", "transient_beyond_quota", "ops-bot", "inventory", "claude-3-5-haiku")
def loop_error_transient_no_backoff(r: Run) -> None:
    """Inventory API returns 503; the agent retries 7 times immediately, far past the retry quota."""
    r.user("How many units of SKU KETTLE-STEEL are left in the Lyon warehouse?")
    _fail_repeat(
        r,
        "http_get",
        {"url": "https://inventory.internal.example/v1/stock?sku=KETTLE-STEEL&wh=LYS1"},
        {"status": 503, "body": "upstream connect error or disconnect/reset before headers"},
        error_class="transient",
        attempts=8,
        gap=(0.1, 0.5),
    )
    r.finish("failed", terminated_by="error")


@loop("repeated_error", "repeat_empty_result", "support-bot", "order_lookup", "deepseek-chat")
def loop_error_empty_result(r: Run) -> None:
    """Order search by a mistyped e-mail returns empty_result; the agent repeats it unchanged."""
    r.user("I ordered a lamp last week with jon.smith@exmaple.com, where is it?")
    _fail_repeat(
        r,
        "search_orders",
        {"email": "jon.smith@exmaple.com", "since": "2026-03-01"},
        {"orders": []},
        error_class="empty_result",
        attempts=6,
    )
    r.finish("abandoned", terminated_by="user")


@loop("repeated_error", "repeat_not_found_noise", "billing-assistant", "billing", "gpt-4o")
def loop_error_not_found_noise(r: Run) -> None:
    """get_invoice for a non-existent id fails not_found 6 times; request_id/timestamp noise each call."""
    r.user("Please resend invoice INV-2026-0042.")
    _fail_repeat(
        r,
        "get_invoice",
        lambda rr: {"invoice_id": "INV-2026-0042", "request_id": rr.req_id(), "timestamp": rr.now()},
        {"error": "invoice INV-2026-0042 not found"},
        error_class="not_found",
        attempts=6,
    )
    r.finish("failed")
