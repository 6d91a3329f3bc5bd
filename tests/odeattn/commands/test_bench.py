"""`odeattn bench` on bad input: one line naming the option, exit 2, nothing written, before any work."""

import pytest


@pytest.mark.parametrize("argv, message", [
    pytest.param(["bench", "--shape", "1,8,15,2"], "--shape: expected four positive integers with d_model a multiple of heads",
                 id="shape-width-not-a-multiple-of-heads"),
    pytest.param(["bench", "--plot", "{d}/p.png", "--no-scaling"],
                 "--plot: the plot shows the scaling tables, which --no-scaling skips", id="plot-without-scaling"),
    pytest.param(["bench", "--json", "{d}/missing/b.json"], "--json: the folder '{d}/missing' does not exist",
                 id="json-in-a-missing-folder"),
    pytest.param(["bench", "--json", "{d}"], "--json: expected a file path; got the folder '{d}'", id="json-is-a-folder"),
    pytest.param(["bench", "--memory", "--memory-steps", "1,x"],
                 "--memory-steps: expected comma-separated integers >= 1; got '1,x'", id="memory-steps-not-integers"),
    pytest.param(["bench", "--memory", "--shape", "1,8,16,2", "--shape", "1,4,8,2"], "--shape: --memory takes one shape; got 2",
                 id="memory-with-two-shapes"),
    pytest.param(["bench", "--memory", "--plot", "{d}/m.svg"], "--plot: expected a file ending in .png; got '{d}/m.svg'",
                 id="memory-plot-not-png"),
    pytest.param(["bench", "--decode", "--long-context"], "--long-context: an option of the main table, which --decode replaces",
                 id="decode-with-a-main-table-option"),
    pytest.param(["bench", "--memory", "--paths", "torch-eager"], "--paths: an option of the main table, which --memory replaces",
                 id="memory-with-a-main-table-option"),
])
def test_bad_input_is_refused_in_one_line_with_exit_2(files, argv, message, capsys, refused_in_one_line):
    refused_in_one_line(files, argv, message, capsys)


@pytest.mark.parametrize("option", ["--steps", "--repeats"])
def test_counts_below_one_are_refused_by_the_parser(option, capsys, argument_type_refused):
    argument_type_refused(["bench", option, "0"], f"argument {option}: expected an integer >= 1; got '0'", capsys)


@pytest.mark.parametrize("option", ["--threads", "--warmup"])
def test_negative_counts_are_refused_by_the_parser(option, capsys, argument_type_refused):
    argument_type_refused(["bench", option, "-1"], f"argument {option}: expected an integer >= 0; got '-1'", capsys)
