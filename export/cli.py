"""`odeattn export` and `odeattn run` (filled in by the ONNX export)."""


def register(sub) -> None:
    pass
