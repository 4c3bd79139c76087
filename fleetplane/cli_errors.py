"""What the CLI prints for an error, and its exit code: one ``error:`` line per problem,
never a Python traceback unless ``--verbose`` asks for it.

Exit codes (README "Commands"): 2 for a config file that is invalid (``ConfigError``:
the file is wrong, checked before anything is sent); 1 for everything the instance
refused or that failed, bad user code included (``BuildError``: an ``import_path`` that
does not import, constructor arguments the class does not take, a ``user_config`` with no
``reconfigure()``, a ``runtime_env`` Ray refuses: found by importing the code where it
runs, so the file itself was valid). "nothing was changed." follows where that is true:
an invalid config, a refused deploy. Anything else is a bug or an environment problem:
its type and first line, exit 1, and ``--verbose`` for the traceback.
"""

from __future__ import annotations

import traceback
from typing import TextIO

from controlplane.errors import (BuildError, ConfigError, DeployRejected, NoInstance,
                                 exception_line)
from controlplane.status import UnknownName

EXIT_OK, EXIT_FAILED, EXIT_BAD_CONFIG = 0, 1, 2

# Errors whose message says it all: the CLI's own traceback would say nothing more.
_EXPECTED = (NoInstance, DeployRejected, TimeoutError, UnknownName)


def report(error: Exception, stream: TextIO, *, verbose: bool, refused: bool) -> int:
    """Print ``error`` to ``stream`` and return the exit code. ``refused``: the error
    means the instance refused the request, so nothing was changed."""
    if isinstance(error, ConfigError):
        print(f"error: {error}\nnothing was changed.", file=stream)
        return EXIT_BAD_CONFIG
    if isinstance(error, BuildError):
        if verbose and error.detail:
            print(error.detail.rstrip(), file=stream)
        for each in error.by_application():
            hint = " (--verbose shows the traceback)" if each.detail and not verbose else ""
            print(f"error: {each}{hint}", file=stream)
    elif isinstance(error, _EXPECTED):
        if verbose:
            traceback.print_exception(error, file=stream)
        print(f"error: {error}", file=stream)
    else:  # unexpected: still one line; the stack only when asked for
        if verbose:
            traceback.print_exception(error, file=stream)
        print(f"error: {exception_line(error)}"
              f"{'' if verbose else ' (--verbose shows the traceback)'}", file=stream)
    if refused and isinstance(error, (BuildError, DeployRejected)):
        print("nothing was changed.", file=stream)
    return EXIT_FAILED
