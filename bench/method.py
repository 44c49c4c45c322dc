"""How the benchmark measures: the figures bench/host.py and bench/measure.py run with, which
bench/report.py quotes on docs/benchmark.md from here (so the page cannot say other figures than
the ones a run used). Standard library only: the report needs no test host."""

from __future__ import annotations

from cnpa_controller.config import LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS

PERIOD = 3.0  # s: cnpa-op.service's sleep between two passes of the 3 s loop
# Restore and ready polls: short against the event-driven targets (p50 0.1 s), a few dozen cheap
# GETs per second against a 2-core server.
POLL = 0.02
IDLE_WINDOW = 20.0  # s; far shorter than the watch controller's resync (300 s): "between resyncs"
# Idle means the cluster too: after N new namespaces the controller-manager's service-account,
# root-CA and quota controllers write into each at 20 requests/s apiece (about 250 s at N = 5,000),
# and every quota status write is an event the controllers under test receive. The idle window
# starts once nobody but Lease holders has written for QUIET_FOR seconds (at most QUIET_BOUND).
QUIET_FOR, QUIET_BOUND = 10.0, 900.0
# From this N on, every row starts on a new test host instead of deleting the previous row's
# namespaces: the namespace controller takes tens of minutes for 5,000, and what it has not
# finished would load the next row.
FRESH_HOST_FROM = 1000
# The naive baseline takes minutes per pass at N = 200 (hours to converge 1,000). The 3 s loop fits
# up to about 1,000: at 5,000 its idle pass alone (3.5 s, bench/NOTES.md) is longer than its sleep.
MAX_N = {"naive": 200, "reconcile.sh": 1000, "reconcile.sh-before": 1000}
FLOOR_IN_FLIGHT = 32  # see run.py's run_floor
CLIENT_IN_FLIGHT = 8  # the benchmark's own creates and deletes of N TeamSpaces
# watch-ha's Lease timings unless --ha-timings says: the program's defaults.
HA_TIMINGS = {"lease_s": LEASE_SECONDS, "renew_s": RENEW_SECONDS, "retry_s": RETRY_SECONDS}
# What the watch-ha rows from before timings were recorded (2026-12-04 18:20 UTC) ran with: the
# defaults of then.
LEGACY_HA_TIMINGS = {"lease_s": 15, "renew_s": 10, "retry_s": 2}
