"""The demo: generated agent traffic (`simulation`) and the commands that set it up and send it.

It sits above `ingest` and `dashboards` (it creates a dashboard membership for the demo user) and
nothing imports it back: the product runs without it.
"""
