"""The `odeattn` command: info, init, conformance, export, run, bench, diagnose, demo."""

from __future__ import annotations

import sys

import ode_ref
from odeattn.commands import bench, conformance, demo, diagnose, export, info, init, run
from odeattn.commands.args import EXTRAS, CommandFailed, Parser, UsageError

# the order of `odeattn --help`
COMMANDS = {m.__name__.rpartition(".")[2]: m for m in (info, init, conformance, export, run, bench, diagnose, demo)}


def build_parser() -> Parser:
    parser = Parser(prog="odeattn", description=__doc__)
    parser.add_argument("--version", action="version", version=f"odeattn {ode_ref.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS.values():
        module.register(sub)
    return parser


def title(args) -> str:
    """The command as typed, e.g. 'conformance generate': what its error lines begin with."""
    module = COMMANDS[args.command]
    return module.title(args) if hasattr(module, "title") else args.command


def main(argv=None) -> int:
    """Run one command. The one error exit of every command: bad input (a UsageError, raised while
    the command reads and checks its input: commands.args.user_input) prints `odeattn COMMAND:
    message`, a line per line of the message, and returns 2; so does a missing optional package,
    named with the extra that installs it. A CommandFailed prints the same way and returns its
    code. A reader that closed the output early (`| head`) ends it quietly, as a Unix filter does.
    Anything else is a bug and keeps its traceback."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at the interpreter's flush
        return 141  # 128 + SIGPIPE, as a shell reports a filter stopped by its reader
    except ModuleNotFoundError as err:
        top = (err.name or "").partition(".")[0]
        if top not in EXTRAS:
            raise
        print(f"odeattn {title(args)}: needs the package {top!r}, which is not installed; "
              f"install it with: pip install 'odeattn[{EXTRAS[top]}]'", file=sys.stderr)
        return 2
    except (UsageError, CommandFailed) as err:
        for line in str(err).splitlines() or [type(err).__name__]:
            print(f"odeattn {title(args)}: {line}", file=sys.stderr)
        return err.code


if __name__ == "__main__":
    sys.exit(main())
