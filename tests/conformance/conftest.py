import pytest

from odeattn.conformance import golden


@pytest.fixture(scope="session")
def regenerated(tmp_path_factory):
    """The golden set written afresh on this machine by the command's own code."""
    out = tmp_path_factory.mktemp("golden")
    golden.write_golden(out)
    return out
