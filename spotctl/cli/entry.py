"""The ``spotctl`` console entry point, kept free of imports so that Ctrl-C or SIGTERM arriving while the
CLI toolkit still loads ends as it does later: one line and exit 130 or 143, never a traceback."""

from __future__ import annotations

import signal
import sys


def run() -> None:
    from spotctl.core.errors import ExitCode, Terminated

    def on_term(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, on_term)
    try:
        from spotctl.cli.main import run as main_run
    except KeyboardInterrupt as e:
        term = isinstance(e, Terminated)
        sys.stderr.write(f"spotctl: {'terminated' if term else 'interrupted'}\n")
        sys.exit(int(ExitCode.TERMINATED if term else ExitCode.INTERRUPTED))
    main_run()
