"""What the JAX port's tests share."""

import pytest


def _count_primitive(jaxpr, name, skip_scan=False):
    """How many `name` equations a jaxpr holds, nested calls included (optionally not inside scan)."""
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive.name == name
        if skip_scan and eqn.primitive.name == "scan":
            continue
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                n += _count_primitive(inner, name, skip_scan)
    return n


@pytest.fixture
def count_primitive():
    return _count_primitive
