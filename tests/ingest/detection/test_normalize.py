from ingest.detection.normalize import canonical, digest, result_facts, split_cursor


def test_keys_sorted_noise_dropped_numbers_rounded_strings_tidied():
    a = {"q": "  open   orders ", "limit": 10.0000001, "request_id": "r-1", "filters": {"b": 1, "a": [1, 2]}}
    b = {
        "filters": {"a": [1, 2], "b": 1},
        "limit": 10,
        "q": "open orders",
        "request_id": "r-2",
        "timestamp": "x",
    }
    assert canonical(a) == canonical(b)
    assert digest(canonical(a)) == digest(canonical(b))


def test_uuid_under_an_id_like_key_is_noise_but_a_real_id_is_not():
    one = canonical({"trace_id": "3f2b8c1e-1d2a-4c3b-9e8f-0a1b2c3d4e5f", "order_id": "ORD-1"})
    two = canonical({"trace_id": "9a9a8c1e-1d2a-4c3b-9e8f-0a1b2c3d4e5f", "order_id": "ORD-1"})
    assert one == two == {"order_id": "ORD-1"}
    assert canonical({"order_id": "ORD-2"}) != one


def test_casefold_only_when_the_tool_says_so():
    assert canonical({"q": "Paris"}) != canonical({"q": "paris"})
    assert canonical({"q": "Paris"}, casefold=True) == canonical({"q": "paris"}, casefold=True)


def test_cursor_fields_are_split_off():
    rest, cursor = split_cursor({"q": "x", "page": 2, "Offset": 5}, frozenset({"page", "offset"}))
    assert rest == {"q": "x"} and cursor == {"page": 2, "Offset": 5}


def test_facts_ignore_order_of_list_items_and_noise():
    one = result_facts({"items": [{"id": 1}, {"id": 2}], "fetched_at": "2026-11-29T10:00:00Z"})
    two = result_facts({"items": [{"id": 2}, {"id": 1}], "fetched_at": "2026-11-29T10:05:00Z"})
    assert sorted(one) == sorted(two) and len(one) == 2
    assert set(result_facts({"items": [{"id": 3}]})) - set(one)
