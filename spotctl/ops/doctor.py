"""``spotctl doctor``: run each probe once, concurrently, each bounded; judge what they saw (``spotctl.core.doctor``).

No region lock is taken and nothing is retried or waited for beyond a probe's own bound: a probe whose
call does not come back within :data:`PROBE_SECONDS` (or the adapter's shorter timeout) fails as
unavailable, and its thread is left to end on its own (a daemon: it never holds the process). Probes that
need another (an endpoint needs keystone's token) run after it, and are skipped when it did not pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from spotctl.core import deadline
from spotctl.core.config import RegionConfig
from spotctl.core.doctor import PASS, Probe, Result, Seen, judge, summary
from spotctl.core.errors import ExitCode, SpotctlError, UnavailableError

log = logging.getLogger(__name__)

#: The longest a probe is waited for (its requests are bounded by the shorter of this and their own timeout).
PROBE_SECONDS = 15.0


def _observe(probe: Probe, end: float) -> Seen:
    t0 = time.monotonic()
    base: dict[str, Any] = {"check": probe.check, "target": probe.target, "kind": probe.kind,
                            "context": dict(probe.context)}
    try:
        with deadline.until(end):
            obs = probe.run()
    except SpotctlError as e:
        return Seen(**base, detail=e.message, error_code=e.code, error_hint=e.hint, error_exit=int(e.exit_code),
                    elapsed_s=time.monotonic() - t0)
    except Exception as e:  # a library error no adapter translated: reported, never a crash of the whole run
        log.debug("doctor: %s raised", probe.check, exc_info=True)
        return Seen(**base, detail=f"{type(e).__name__}: {e}"[:500], error_code="error",
                    error_exit=int(ExitCode.UNEXPECTED), elapsed_s=time.monotonic() - t0)
    return Seen(**base, detail=obs.detail, facts=dict(obs.facts), elapsed_s=time.monotonic() - t0)


def _run_all(probes: Sequence[Probe], seconds: float) -> list[Seen]:
    """Each probe in its own daemon thread, all at once; one that has not answered by the bound fails."""
    end = time.monotonic() + seconds
    box: dict[int, Seen] = {}
    threads = []
    for i, p in enumerate(probes):
        def work(i: int = i, p: Probe = p) -> None:
            box[i] = _observe(p, end)

        t = threading.Thread(target=work, name=f"doctor-{p.check}", daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    out = []
    for i, p in enumerate(probes):
        seen = box.get(i)
        if seen is None:
            err = UnavailableError(f"{p.check}: no answer within {seconds:g} s")
            seen = Seen(p.check, p.target, p.kind, detail=err.message, error_code=err.code,
                        error_exit=int(err.exit_code), elapsed_s=seconds, context=dict(p.context))
        out.append(seen)
    return out


def run(region: RegionConfig, probes: Sequence[Probe], *, backend: str | None = None,
        probe_seconds: float = PROBE_SECONDS) -> dict[str, Any]:
    """Every probe's result, in the order given, with the exit code they make (``core.doctor.exit_code``)."""
    results: dict[int, Result] = {}
    pending = list(enumerate(probes))
    while pending:
        done_checks = {probes[i].check for i in results}
        ready = [(i, p) for i, p in pending if p.needs is None or p.needs in done_checks
                 or p.needs not in {q.check for q in probes}]
        if not ready:  # a cycle or a missing dependency: make them all now rather than never
            ready = pending
        runnable, skipped = [], []
        for i, p in ready:
            dep = [results[j] for j in results if probes[j].check == p.needs]
            if dep and any(r.result != PASS for r in dep):
                skipped.append((i, p, dep[0]))
            else:
                runnable.append((i, p))
        for i, p, dep_result in skipped:
            results[i] = judge(Seen(p.check, p.target, p.kind, skipped_because=f"{p.needs} did not pass "
                                    f"({dep_result.result})", context=dict(p.context)))
        for (i, _), seen in zip(runnable, _run_all([p for _, p in runnable], probe_seconds)):
            results[i] = judge(seen)
        ready_ids = {i for i, _ in ready}
        pending = [(i, p) for i, p in pending if i not in ready_ids]
    ordered = [results[i] for i in range(len(probes))]
    return summary(region.name, backend or region.backend, ordered)
