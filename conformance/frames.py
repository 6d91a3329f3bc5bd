"""Frames: how the suite's processes, and external workers in any language, send messages.

A frame is an 8-byte header (two little-endian uint32: the JSON part's length, then the
payload's), a UTF-8 JSON object, and a payload: a safetensors file of the message's arrays, or
nothing. Nothing is pickled. The suite's own workers (worker.py) and external backends
(external.py, docs/protocol.md) use the same frames.
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


def decode(body: bytes, payload: bytes) -> tuple[dict, dict]:
    from safetensors.numpy import load

    return json.loads(body), (load(payload) if payload else {})


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
