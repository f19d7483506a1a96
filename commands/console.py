"""Where the commands print: results to stdout, as wide as the terminal (piped output, in CI logs
or through `| tee`, has no width: room for the run summary's 100 columns and most `crucible sql`
results), and errors to stderr, one line however long."""

import shutil

from rich.console import Console

console = Console(width=shutil.get_terminal_size((140, 40)).columns)
errors = Console(stderr=True, soft_wrap=True)
