"""The archive records of deleted TeamSpaces: a file per deletion, and a ConfigMap per deletion
in the cluster when an archive namespace is set, both kept before the finalizer is released.

A record is written to a temporary file, flushed, renamed and its directory flushed, so that a
crash leaves either the whole record or none. What is found at NAME.json first is never
overwritten unread: an earlier record of that name with another uid is kept as NAME.UID.json, one
that cannot be read as a record as NAME.unreadable-DIGEST.json. An archive directory that is
missing or was replaced (the service's sandbox still binds the old one) refuses every record: the
controller then exits 4 so that systemd restarts it with fresh mounts. A ConfigMap found in place
must be this very record, or the finalizer stays.

ArchiveStore.keep() says what became of one record (Kept: what was written, and what failed) and
leaves the Events, the metrics and the stopping to its caller (the executor).
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import os
import random
import string
import threading
from dataclasses import dataclass, field
from typing import Callable

from . import plan
from .api import Api, ApiError, path_of
from .plan import ARCHIVE_FAILED, ARCHIVE_RECORD_MISMATCH, MANAGED_BY

ARCHIVE_LABEL = "platform.labhub.io/archived-teamspace"


@dataclass
class Kept:
    """What became of one record. written: (op, line) of each copy made (op "write": the file,
    "configmap": the cluster's); failure: (reason, message) when the finalizer must stay;
    broken: the archive directory is missing or was replaced; not_leader: stopped before a write
    because this process may not write now."""

    written: list = field(default_factory=list)
    failure: tuple[str, str] | None = None
    broken: bool = False
    not_leader: bool = False


def archive_configmap(teamspace: str, uid: str, record: str, namespace: str) -> dict:
    """The cluster's copy of an archive record: one ConfigMap per deleted TeamSpace (by uid, so a
    second TeamSpace of the same name gets its own), labelled with the TeamSpace's name so that
    `kubectl get configmaps -n NAMESPACE -l platform.labhub.io/archived-teamspace=NAME` finds
    every record of that name. Immutable: its data can never be changed, only the whole record
    deleted (the role's admission policy refuses the rest, and any create but the controller's)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"archive-{uid}", "namespace": namespace,
                         "labels": {MANAGED_BY[0]: MANAGED_BY[1], ARCHIVE_LABEL: teamspace[:63]}},
            "data": {f"{teamspace}.json": record + "\n"}, "immutable": True}


def same_record(have: dict, want: dict) -> bool:
    """An archive ConfigMap found in place is this record: the same data, labelled as ours."""
    labels = (have.get("metadata") or {}).get("labels") or {}
    return (have.get("data") == want["data"]
            and all(labels.get(k) == v for k, v in want["metadata"]["labels"].items()))


def _short_json(value: object) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= 200 else f"{text[:200]}... ({len(text)} characters)"


def kept_record_path(d: str, name: str, uid: str, have: str) -> str:
    """Where the record found at NAME.json is kept before the record of `uid` replaces it: "" when
    it is an earlier copy of that same deletion's record; NAME.OLDUID.json when it records another
    deletion of that name; NAME.unreadable-DIGEST.json when it cannot be read as a record (torn by
    hand, or from a tool of somebody else's): nothing found there is overwritten unread. (Long
    names: without NAME, as the record itself then is.)"""
    try:
        old = json.loads(have).get("uid") or ""
    except (ValueError, AttributeError):
        old = ""
    if old == uid:
        return ""
    if not old or not isinstance(old, str) or "/" in old:
        old = "unreadable-" + hashlib.sha256(have.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return os.path.join(d, f"{name}.{old}.json" if len(name) <= 200 else f"{old}.json")


def archive_directory_broken(path: str) -> bool:
    """The directory was removed or replaced since the service's sandbox bound it (it sees a
    deleted directory, link count 0, or the read-only file system beneath once the kernel has
    detached the bind mount), or it is missing and cannot be made."""
    try:
        if os.path.isdir(path) and os.stat(path).st_nlink == 0:
            return True
        os.makedirs(path, exist_ok=True)
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return True


def _fsync_path(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mktemp(d: str, prefix: str) -> tuple[int, str]:
    """.NAME.json.XXXXXX, mktemp's form (earlier versions' reconcile.sh left these too: the
    sweep removes either's leftovers)."""
    chars = string.ascii_letters + string.digits
    for _attempt in range(100):
        path = os.path.join(d, prefix + "".join(random.choices(chars, k=6)))
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), path
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, "no free temporary name", d)


class ArchiveStore:
    """The records of one archive directory (and namespace: "" keeps them on disk only);
    may_write() is asked just before each write (the Lease's fence)."""

    def __init__(self, api: Api, directory: str, namespace: str = "", *,
                 may_write: Callable[[], bool] = lambda: True) -> None:
        self.api = api
        self.directory = directory
        self.namespace = namespace
        self.may_write = may_write
        self._swept = ""  # the archive directory whose leftovers are gone
        self._sweep_lock = threading.Lock()

    def keep(self, w: plan.Archive) -> Kept:
        """Keep the record of one deletion, on disk and (with a namespace) in the cluster."""
        kept = Kept()
        name, uid, d = w.teamspace, w.uid, self.directory
        if archive_directory_broken(d):
            kept.broken = True
            kept.failure = (ARCHIVE_FAILED, f"archive directory {d} is missing or was replaced "
                            "while cnpa-op runs; keeping the finalizer until the service restarts "
                            "(deletion waits)")
            return kept
        if not self.may_write():
            kept.not_leader = True
            return kept
        record = json.dumps(w.record, separators=(",", ":"), ensure_ascii=False)
        path = os.path.join(d, f"{name}.json" if len(name) <= 240 else f"{uid}.json")
        try:
            # Any bytes: a file that is not UTF-8 is kept aside like any unreadable one.
            with open(path, encoding="utf-8", errors="surrogateescape") as fh:
                have = fh.read()
        except OSError:
            have = None
        if have is None or have.rstrip("\n") != record:
            # Not archived on this host by an earlier pass yet.
            kept.failure = self._write(d, name, uid, path, record, have)
            if kept.failure:
                return kept
            kept.written.append(("write", f"archived to {path}"))
        if self.namespace:
            self._in_cluster(w, record, kept)
        return kept

    def _write(self, d: str, name: str, uid: str, path: str, record: str,
               have: str | None) -> tuple[str, str] | None:
        """The record at path, the earlier one kept aside first; the failure, if any."""
        self._sweep(d)
        if have is not None:
            keep = kept_record_path(d, name, uid, have)
            if keep:
                try:
                    self._keep_earlier(d, name, keep, have)
                except OSError:
                    return ARCHIVE_FAILED, (f"cannot keep the earlier record of {name} as {keep}; "
                                            "keeping the finalizer, deletion waits")
        try:
            self._write_durably(d, name, path, record + "\n")
        except OSError:
            return ARCHIVE_FAILED, f"cannot write {path}; keeping the finalizer, deletion waits"
        return None

    def _in_cluster(self, w: plan.Archive, record: str, kept: Kept) -> None:
        """With several controller hosts, the host that archived a deletion may die right after
        releasing the finalizer, and its disk with it: the record is also kept in the cluster,
        as ConfigMap archive-UID in the archive namespace, before the release. One already there
        (an earlier pass, another host) is read and must be this record: a ConfigMap of that
        name with other content (made by somebody else, or before the policy protected them) is
        no record of this deletion, and the finalizer stays until it is removed."""
        obj = archive_configmap(w.teamspace, w.uid, record, self.namespace)
        where = f"ConfigMap {self.namespace}/{obj['metadata']['name']}"
        if not self.may_write():
            kept.not_leader = True
            return
        try:
            self.api.request("POST", path_of(obj, collection=True), body=obj)
        except ApiError as exc:
            if exc.reason != "AlreadyExists":
                kept.failure = (ARCHIVE_FAILED, f"cannot keep the archive record in {where} "
                                f"({exc}); keeping the finalizer, deletion waits")
                return
            try:
                have = self.api.request("GET", path_of(obj))
            except ApiError as exc2:
                kept.failure = (ARCHIVE_FAILED, f"{where} exists and cannot be read ({exc2}); "
                                "keeping the finalizer, deletion waits")
                return
            if not same_record(have, obj):
                kept.failure = (ARCHIVE_RECORD_MISMATCH,
                                f"{where} exists but is not this deletion's record (it holds "
                                f"{_short_json(have.get('data'))}, labels "
                                f"{_short_json((have.get('metadata') or {}).get('labels'))}); not "
                                "trusting it: keeping the finalizer until it is removed (kubectl "
                                f"delete configmap -n {self.namespace} {obj['metadata']['name']})")
            return
        kept.written.append(("configmap", f"archived to {where}"))

    def _sweep(self, d: str) -> None:
        """A process killed between creating a temporary file and renaming it leaves it behind:
        removed once, before this store makes its own. Not per record: a listing of the
        directory per deletion made a mass deletion quadratic in the records kept (all of it
        holding the interpreter's lock; the benchmark's figures). Under a lock, so that no temporary
        file of this store exists while the sweep runs; a pass (reconcile.sh) has one store, so
        it sweeps once per pass."""
        if self._swept == d:
            return
        with self._sweep_lock:
            if self._swept == d:
                return
            try:
                with os.scandir(d) as entries:
                    for entry in entries:
                        if fnmatch.fnmatchcase(entry.name, ".*.json.??????"):
                            os.unlink(entry.path)
            except OSError:
                return  # tried again with the next record; writing it says what is wrong
            self._swept = d

    def _keep_earlier(self, d: str, name: str, keep: str, have: str) -> None:
        """The earlier record, before NAME.json is replaced: a copy made like the record itself
        (temporary file, flushed, renamed), so a full disk or a crash leaves no torn copy that a
        later pass would take for a good one; a copy that exists must be byte for byte the
        earlier record, or it is made again."""
        try:
            with open(keep, encoding="utf-8", errors="surrogateescape") as fh:
                if fh.read() == have:
                    return
        except FileNotFoundError:
            pass
        self._write_durably(d, name, keep, have)

    @staticmethod
    def _write_durably(d: str, name: str, path: str, text: str) -> None:
        """path holds text in full, on disk (file and directory flushed), or is unchanged."""
        tmp = None
        try:
            fd, tmp = mktemp(d, f".{name}.json.")
            with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            tmp = None
            _fsync_path(d, directory=True)
        finally:
            if tmp:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
