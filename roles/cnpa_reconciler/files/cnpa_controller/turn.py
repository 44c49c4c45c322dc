"""A pass's turn on the controllers' Lease (PassTurn): leader.Elector's campaign, with what a
pass needs around it (a first look, a bounded wait, renewal while it writes, the Lease given
back at once)."""

from __future__ import annotations

import logging
import random
import threading
import time

from .api import Api, ApiError
from .config import LeaseSettings
from .leader import JITTER, Elector, boottime

# The Lease's news, under the elector's logger: one place to look for who held it.
log = logging.getLogger("cnpa_controller.leader")


class PassTurn:
    """A pass's turn on the Lease (once.py): one-pass writers take turns with the long-running
    controllers on the same Lease, so that two writers cannot happen, whichever mode runs where.

    take() campaigns as an Elector does (free or expired as this process saw it: acquired; a
    deleted Lease: created once it has been missing for lease_seconds) until it leads, or until
    it sees another holder renew (a live holder: the pass writes nothing), for at most about
    lease_seconds plus a retry. Where the Lease's namespace does not exist, nobody can hold it
    (the lab's first passes, before the role made it): the pass writes unfenced. While the pass
    writes, the Lease is renewed from a thread of its own (may_write() is the fence); done()
    gives it up at once, so that the next pass, or a watch controller, takes it without waiting.

    Returns of take(): LEADING, NO_LEASE, REFUSED (the Lease may not be read: the pass writes
    nothing and says which permission is missing), or the identity of the live holder."""

    LEADING, NO_LEASE, REFUSED = "leading", "no-lease", "refused"

    def __init__(self, api: Api, lease: LeaseSettings, *, clock=boottime, wall=time.time) -> None:
        self.elector = Elector.of(api, lease, clock=clock, wall=wall, news=logging.DEBUG)
        self.api = api
        self._clock = clock
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.outcome = ""

    def take(self, wait=time.sleep) -> str:
        e = self.elector
        first_look = self._first_look()
        if first_look:
            self.outcome = first_look
            return self.outcome
        deadline = self._clock() + e.lease_seconds + 2 * e.retry_seconds + 2 * e.request_timeout
        first: dict | None = None
        while True:
            e.step()
            if e.is_leader():
                self.outcome = self.LEADING
                self._renewer = threading.Thread(target=e.run, args=(self._stop,),
                                                 name="lease-renewal", daemon=True)
                self._renewer.start()
                return self.outcome
            seen = e.observed()
            holder = (seen or {}).get("holderIdentity") or ""
            if first is None:
                first = seen
            elif holder and seen != first:
                # The holder renewed while we looked: it is alive, and it writes.
                self.outcome = holder
                return holder
            if self._clock() >= deadline:
                self.outcome = holder or "(nobody: the Lease could not be taken)"
                return self.outcome
            wait(e.retry_seconds * (1 + JITTER * random.random()))

    def may_write(self) -> bool:
        return self.outcome == self.NO_LEASE or self.elector.is_leader()

    def done(self) -> None:
        """The pass is over: stop renewing and give the Lease up (if held)."""
        if self.outcome == self.LEADING:
            self.elector.release()
            self._stop.set()
            if self._renewer is not None:
                self._renewer.join(2 * self.elector.request_timeout + 1)

    def _first_look(self) -> str:
        """NO_LEASE when the Lease is missing and so is its namespace (one GET each, the second
        only when the Lease is missing); REFUSED when this identity may not read the Lease; ""
        otherwise (take() campaigns; a transient error is read again there)."""
        e = self.elector
        try:
            self.api.request("GET", e.path, timeout=e.request_timeout)
            return ""
        except ApiError as err:
            if err.status in (401, 403):
                log.error("%s: cannot read lease %s (%s): this pass writes nothing; the identity "
                          "needs get, update and create on that Lease (the role grants them)",
                          e.identity, e.describe(), err)
                return self.REFUSED
            if err.status != 404:
                return ""
        try:
            self.api.request("GET", f"/api/v1/namespaces/{e.namespace}", timeout=e.request_timeout)
        except ApiError as err:
            return self.NO_LEASE if err.status == 404 else ""
        return ""
