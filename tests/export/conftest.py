import pytest


@pytest.fixture
def refused_in_one_line(capsys):
    """check(argv, changed, message): the command argv, with its items at the indices of changed
    replaced (index -> value), exits 2 and prints one line holding message."""
    from odeattn.cli import main

    def check(argv, changed: dict, message: str) -> None:
        args = list(argv)
        for i, value in changed.items():
            args[i] = value
        capsys.readouterr()
        assert main(args) == 2
        line, = capsys.readouterr().err.strip().splitlines()
        assert message in line, line

    return check
