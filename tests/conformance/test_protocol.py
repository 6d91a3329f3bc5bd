"""The adapter protocol: check_adapter reads its required members from protocol.Adapter, and the
built-in adapters' methods take the protocol's arguments."""

import inspect

import pytest

from odeattn.conformance import Adapter, OptionalMethods
from odeattn.conformance.adapters import (JaxAdapter, OnnxReferenceAdapter, OnnxRuntimeAdapter, SpecAdapter, TorchAdapter,
                                          check_adapter)
from odeattn.conformance.adapters.protocol import OPTIONAL, REQUIRED


def test_the_protocol_lists_the_required_and_optional_members():
    assert REQUIRED == ("name", "dtypes", "supports", "run_block")
    assert OPTIONAL == ("support", "run_trajectory", "run_func", "run_decode", "run_vjp", "run_encoder", "run_lm", "run_stages")


class NoRunBlock:
    name, dtypes = "half", ("float32",)

    def supports(self, config, dtype):
        return None


def test_check_adapter_names_what_the_protocol_requires_and_what_is_missing():
    with pytest.raises(TypeError, match=r"expected attributes name, dtypes, supports, run_block; missing \['run_block'\]"):
        check_adapter(NoRunBlock())
    NoRunBlock.run_block = lambda self, config, params, x, padding_mask, dtype: x
    try:
        assert check_adapter(NoRunBlock()) == ("float32",)
    finally:
        del NoRunBlock.run_block


def _parameters(function) -> list[str]:
    return [p for p in inspect.signature(function).parameters if p != "self"]


@pytest.mark.parametrize("adapter", [SpecAdapter, TorchAdapter, JaxAdapter, OnnxRuntimeAdapter, OnnxReferenceAdapter],
                         ids=lambda a: a.__name__)
def test_builtin_methods_take_the_protocols_arguments(adapter):
    for name in REQUIRED + OPTIONAL:
        protocol = Adapter if name in REQUIRED else OptionalMethods
        mine = getattr(adapter, name, None)
        if callable(mine) and callable(getattr(protocol, name, None)):
            assert _parameters(mine) == _parameters(getattr(protocol, name)), (adapter.__name__, name)
