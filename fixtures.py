"""What every tier of tests and the benchmark build TeamSpaces with and judge their cpu by: beside
them both, so that neither imports from the other (dev.py's link_checkout makes it importable).

The tests' hosts themselves come from tests/hostlib.session_host (one per test directory and
worker)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from cnpa_controller.plan import API_VERSION
from cnpa_controller.quantity import quantity


def teamspace(name: str, pods: int = 4, cpu: str | None = None, **metadata) -> dict:
    """A TeamSpace manifest; cpu left out means the CRD's default. metadata: more of it (uid,
    generation, resourceVersion, finalizers, deletionTimestamp, ...: a TeamSpace as the API
    server returns it, for the tests that hand one to the plan or the executor)."""
    spec: dict = {"pods": pods}
    if cpu is not None:
        spec["cpu"] = cpu
    return {"apiVersion": API_VERSION, "kind": "TeamSpace", "metadata": {"name": name, **metadata},
            "spec": spec}


def cpu(text: str) -> Fraction:
    """A cpu quantity's exact value, by the plan's reading of the whole grammar (500u, 1.5e0,
    2Ki ...; tests/unit/test_plan.py pins that reading to literal values)."""
    value = quantity(text)
    assert value is not None, f"not a quantity: {text!r}"
    return value


def unreachable_kubeconfig(directory: Path) -> Path:
    """A kubeconfig in directory whose API server refuses at once: port 1 on loopback has no
    listener, so a pass or the CLI meets "connection refused" without waiting for a timeout."""
    k = directory / "kubeconfig"
    k.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                 "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
                 "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
                 "users: [{name: u, user: {token: t}}]\n")
    return k
