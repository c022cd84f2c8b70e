from tests.ingest.detection.runs import RunBuilder, interventions


def test_a_non_retryable_error_is_corrected_at_the_2nd_identical_failure():
    run = RunBuilder()
    for _ in range(3):
        run.call(
            "get_order",
            {"id": "bad id"},
            {"error": "invalid id"},
            status="error",
            error_class="invalid_argument",
        )
    found = interventions(run.detect())
    assert (found[0].kind, found[0].action, found[0].at_call) == ("repeated_error", "correct", 2)
    assert "invalid_argument" in found[0].hint


def test_transient_errors_get_a_retry_quota_and_a_backoff_hint():
    ok = RunBuilder()
    ok.call("http_get", {"url": "https://x/a"}, {"error": "503"}, status="error", error_class="transient")
    ok.wait(2).call(
        "http_get", {"url": "https://x/a"}, {"error": "503"}, status="error", error_class="transient"
    )
    ok.wait(4).call("http_get", {"url": "https://x/a"}, {"body": "hello"})
    assert interventions(ok.detect()) == []
    stuck = RunBuilder()
    for _ in range(5):
        stuck.call(
            "http_get", {"url": "https://x/a"}, {"error": "429"}, status="error", error_class="rate_limited"
        )
    found = interventions(stuck.detect())
    assert found[0].at_call == 4 and "jitter" in found[0].hint  # one try and three retries


def test_empty_results_count_as_failures_of_their_class():
    run = RunBuilder()
    for _ in range(2):
        run.call("search", {"q": "zzz"}, [], error_class="empty_result")
    assert interventions(run.detect())[0].kind == "repeated_error"
