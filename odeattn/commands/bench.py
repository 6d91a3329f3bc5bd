"""`odeattn bench`: registered from odeattn.bench until the bench package's own command module replaces this one."""

from odeattn.bench import register, cmd_bench as run  # noqa: F401
