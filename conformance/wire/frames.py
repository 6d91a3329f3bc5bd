"""Frames: how the suite's processes, and external workers in any language, send messages.

A frame is an 8-byte header (two little-endian uint32: the JSON part's length, then the
payload's), a UTF-8 JSON object, and a payload: a safetensors file of the message's arrays, or
nothing. Nothing is pickled. A bfloat16 array (ml_dtypes') travels as safetensors' own BF16:
its raw 2-byte values under that dtype name, which safetensors.numpy writes but cannot read back.
The suite's own workers (running/worker.py) and external backends (adapters/external.py,
docs/protocol.md) use the same frames.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

HEADER = struct.Struct("<II")


def encode(message: dict, arrays: dict | None = None) -> bytes:
    from safetensors.numpy import save

    payload = save({k: np.asarray(v, order="C") for k, v in arrays.items()}) if arrays else b""
    body = json.dumps(message).encode()
    return HEADER.pack(len(body), len(payload)) + body + payload


# safetensors' dtype names -> NumPy's, for every dtype the format defines that NumPy holds
SAFETENSORS_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "U32": "uint32",
                      "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16", "BF16": "bfloat16",
                      "F32": "float32", "F64": "float64"}


def load_arrays(payload: bytes) -> dict:
    """A safetensors file's arrays, as safetensors.numpy.load reads them, bfloat16 (BF16) too."""
    from safetensors import deserialize

    out = {}
    for name, view in deserialize(payload):
        if view["dtype"] not in SAFETENSORS_DTYPES:
            raise ValueError(f"array {name!r}: dtype {view['dtype']} is not one of {', '.join(SAFETENSORS_DTYPES)}")
        dtype = SAFETENSORS_DTYPES[view["dtype"]]
        if dtype == "bfloat16":
            import ml_dtypes

            dtype = ml_dtypes.bfloat16
        out[name] = np.frombuffer(view["data"], dtype=np.dtype(dtype).newbyteorder("<")).reshape(view["shape"])
    return out


def decode(body: bytes, payload: bytes) -> tuple[dict, dict]:
    return json.loads(body), (load_arrays(payload) if payload else {})


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> tuple[dict, dict]:
    n_body, n_payload = HEADER.unpack(_read_exact(fd, HEADER.size))
    return decode(_read_exact(fd, n_body), _read_exact(fd, n_payload))


def _write_all(fd: int, frame: bytes) -> None:
    data = memoryview(frame)
    while data:
        data = data[os.write(fd, data):]


def write_frame(fd: int, message: dict, arrays: dict | None = None) -> None:
    _write_all(fd, encode(message, arrays))
