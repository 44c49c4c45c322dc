"""The controller's loop around one TeamSpace: what it does when it may not write."""

from __future__ import annotations

import io

from fixtures import teamspace

from cnpa_controller.controller import Controller, Settings


class Follower:
    """An elector that never leads (or has just lost the Lease without a reported change)."""

    def __init__(self, on_change):
        pass

    def is_leader(self):
        return False


class NoApi:
    def request(self, *a, **k):
        raise AssertionError("a process that does not lead must send nothing")


def test_a_name_found_while_not_leading_is_looked_at_again_not_dropped(tmp_path):
    c = Controller(NoApi(), Settings(archive_dir=str(tmp_path), not_leader_retry_seconds=2.0),
                   make_elector=Follower, out=io.StringIO())
    c.caches.teamspaces._store["a"] = teamspace("a", 2, uid="u-1", generation=1,
                                                resourceVersion="5")
    c.reconcile("a")
    # Not forgotten: back in the queue once a renewal could have made this process the leader
    # again (a brief lapse reports no change, so nothing else would queue it before the resync).
    assert c.queue.delayed() == 1
