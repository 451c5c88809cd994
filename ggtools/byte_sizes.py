"""Byte counts for people: 1536 -> '1.50 KiB'. Shared by the terminal output and the reports jobs write."""


def human_bytes(n) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
