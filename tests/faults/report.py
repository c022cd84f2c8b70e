"""The fault scenarios' table (no Django import: bench/faults.py prints it too)."""

from __future__ import annotations

COLUMNS = (
    ("scenario", "<", 22),
    ("sent", ">", 5),
    ("stored", ">", 6),
    ("again", ">", 5),
    ("processed", ">", 9),
    ("detections", ">", 10),
    ("fault_s", ">", 7),
    ("slowest_s", ">", 9),
    ("api_back_s", ">", 10),
    ("detection_back_s", ">", 16),
    ("caught_up_s", ">", 11),
)


def table(rows: list[dict]) -> str:
    """One line per scenario; `-` where a figure does not apply (no request after the fault)."""
    head = " ".join(f"{name:{align}{width}}" for name, align, width in COLUMNS) + "  codes during the fault"
    lines = [head, "-" * len(head)]
    for row in rows:
        cells = " ".join(
            f"{'-' if row[name] is None else row[name]:{align}{width}}" for name, align, width in COLUMNS
        )
        codes = " ".join(f"{code}x{n}" for code, n in row["codes"].items())
        lines.append(f"{cells}  {codes}")
    return "\n".join(lines)
