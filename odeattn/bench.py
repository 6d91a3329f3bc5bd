"""`odeattn bench` (filled in by the benchmarks)."""


def register(sub) -> None:
    pass
