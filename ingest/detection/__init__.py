"""The detection engine: pure Python, no Django import, no clock reads, no I/O (see DESIGN.md)."""
