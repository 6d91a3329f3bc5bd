"""`odeattn info`: the spec's choices and which backends are installed."""

from odeattn.cli import main


def test_info_lists_choices_and_backends(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "rk38 (order 4, 4 stages)" in out and "dynamic_tanh" in out and "decoder" in out


def test_info_says_which_backends_are_installed(capsys, monkeypatch):
    from odeattn.conformance import adapters

    monkeypatch.setitem(adapters.BUILTIN, "torch", adapters.Builtin("x:Y", ("odeattn_absent_package",)))
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "  spec                 installed" in out
    assert "  torch                not installed (missing odeattn_absent_package)" in out
