"""The openvino backend: the exported block, prefill and decode-step models compiled by OpenVINO's
CPU plugin with the float32 hint (docs/deployment.md)."""

import pytest

pytest.importorskip("openvino")

from odeattn.cli import main


def test_the_openvino_backend_passes_the_decode_and_field_cases():
    """Its conformance row on every cached-decoding case (the prefill and decode-step models) and the
    field cases (ALiBi's scale, the rotary bases, HoPE, BAM); the whole set, 129 cases, takes about
    30 s on 2 cores (docs/deployment.md)."""
    assert main(["conformance", "--backend", "openvino", "-k", "^decode_|_field_"]) == 0
