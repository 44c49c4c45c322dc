"""python3 -m cnpa_controller: its flags and variables, and bad configuration refused with a clear
message and exit status 3."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cnpa_controller.__main__ import from_flags, parser
from cnpa_controller.config import (
    OPTIONS,
    ConfigError,
    default_archive_dir,
    duration,
    read_config,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("env", "named"), [
    ({"CNPA_WORKERS": "0"}, "CNPA_WORKERS"),
    ({"CNPA_WORKERS": "two"}, "CNPA_WORKERS"),
    ({"CNPA_REQUEST_TIMEOUT": "soon"}, "CNPA_REQUEST_TIMEOUT"),
    ({"CNPA_RESYNC_SECONDS": "-5"}, "CNPA_RESYNC_SECONDS"),
    ({"CNPA_EVENT_NAMESPACE": "Not_A_Namespace"}, "CNPA_EVENT_NAMESPACE"),
    ({"CNPA_ARCHIVE_DIR": "relative/dir"}, "CNPA_ARCHIVE_DIR"),
    ({"CNPA_LEADER_ELECTION": "yes"}, "CNPA_LEADER_ELECTION"),
    ({"CNPA_RENEW_SECONDS": "20"}, "CNPA_RENEW_SECONDS"),
    ({"CNPA_METRICS_ADDRESS": "nowhere"}, "CNPA_METRICS_ADDRESS"),
    # An IPv6 address without brackets is ambiguous; with them it must be one.
    ({"CNPA_METRICS_ADDRESS": "::1:9808"}, "CNPA_METRICS_ADDRESS"),
    ({"CNPA_METRICS_ADDRESS": "[nohost]:9808"}, "CNPA_METRICS_ADDRESS"),
    # A leader's write gets lease - renew seconds to land: 0.05 s would fail every one.
    ({"CNPA_LEASE_SECONDS": "10", "CNPA_RENEW_SECONDS": "9.95"}, "CNPA_RENEW_SECONDS"),
    ({"CNPA_CACHE_STALE_SECONDS": "1"}, "CNPA_CACHE_STALE_SECONDS"),
    # The Lease holds whole seconds: 2.9 would be written as 2, shorter than the fence's 2.5.
    ({"CNPA_LEASE_SECONDS": "2.9", "CNPA_RENEW_SECONDS": "2.5", "CNPA_LEASE_RETRY_SECONDS": "1"},
     "CNPA_LEASE_SECONDS"),
    # Sent in the User-Agent header: a newline would fail every request while the process runs on.
    ({"CNPA_LEASE_IDENTITY": "host\nx"}, "CNPA_LEASE_IDENTITY"),
    ({"CNPA_LEASE_IDENTITY": "h\u00f6st"}, "CNPA_LEASE_IDENTITY"),
    ({"KUBECONFIG": "/nonexistent/kubeconfig"}, "KUBECONFIG"),
])
def test_bad_values_exit_3_naming_the_variable(env, named):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CNPA_", "KUBECONFIG"))}
    full.update({"KUBECONFIG": "/nonexistent/kubeconfig", **env})
    proc = subprocess.run([sys.executable, "-m", "cnpa_controller"], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert named in proc.stderr


def test_what_validation_accepts_can_run_ipv6_metrics_included():
    """[::1]:PORT passed validation and then the IPv4-only server exited 3: now it serves."""
    import socket
    import urllib.request

    from cnpa_controller.metrics import Metrics

    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::1", 0))
        port = probe.getsockname()[1]
    conf = read_config({"CNPA_METRICS_ADDRESS": f"[::1]:{port}"})
    assert conf.metrics_address == ("::1", port)
    server = Metrics().serve(*conf.metrics_address, checks={"/healthz": list})
    try:
        url = f"http://[::1]:{server.server_address[1]}/healthz"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert (resp.status, resp.read()) == (200, b"ok\n")
    finally:
        server.shutdown()
    conf = read_config({"CNPA_LEASE_SECONDS": "10", "CNPA_RENEW_SECONDS": "9"})
    assert conf.write_timeout == 1


def test_defaults_are_the_lab_s():
    s = read_config({})
    assert (s.archive_dir, s.event_namespace, s.request_timeout) == \
        ("/root/cnpa-op/archive", "default", 10.0)
    assert read_config({"CNPA_BASE_DIR": "/b"}).archive_dir == "/b/archive"
    assert s.election and s.metrics_address is None


def test_the_role_installs_the_program_s_defaults():
    """One set of defaults: what the role passes by default is what the program does without it,
    so a bare run behaves as an installed one (the Lease timings meet the leader-lost figure only
    with these), and a pass run by hand takes its turn on the Lease the installed controllers
    hold (the role's namespace)."""
    import yaml

    role = {}
    for f in ("roles/cnpa/defaults/main.yml", "roles/cnpa_controller/defaults/main.yml"):
        role.update(yaml.safe_load((ROOT / f).read_text()))
    s = read_config({})
    lease = s.lease
    assert s.archive_dir == default_archive_dir()
    # Run by hand from either layout's install, a pass archives where that layout's unit does.
    for layout in role["cnpa_layouts"].values():
        assert default_archive_dir(installed_in=layout["base_dir"]) == layout["archive_dir"]
    assert role["cnpa_controller_event_namespace"] == s.event_namespace
    assert role["cnpa_controller_workers"] == s.workers
    assert role["cnpa_controller_resync_seconds"] == s.resync_seconds
    assert role["cnpa_controller_lease_name"] == lease.name
    assert (role["cnpa_controller_lease_seconds"], role["cnpa_controller_renew_seconds"],
            role["cnpa_controller_lease_retry_seconds"]) == \
        (lease.lease_seconds, lease.renew_seconds, lease.retry_seconds)
    assert role["cnpa_controller_sa_namespace"] == lease.namespace == "cnpa-system"


def test_durations_as_kubectl_takes_them():
    assert duration("X", "10s") == 10 and duration("X", "500ms") == 0.5
    assert duration("X", "1m") == 60 and duration("X", "7") == 7
    with pytest.raises(ConfigError):
        duration("X", "0s")


def test_a_metrics_port_in_use_exits_3(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CNPA_", "KUBECONFIG"))}
        env.update(KUBECONFIG=str(kubeconfig), CNPA_ARCHIVE_DIR=str(tmp_path / "archive"),
                   CNPA_METRICS_ADDRESS=f"127.0.0.1:{taken.getsockname()[1]}")
        proc = subprocess.run([sys.executable, "-m", "cnpa_controller"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "CNPA_METRICS_ADDRESS" in proc.stderr


def test_with_leader_election_writes_time_out_before_another_host_could_take_over():
    s = read_config({})
    assert s.write_timeout == 10 - 7 and s.not_leader_retry_seconds == 2
    assert read_config({"CNPA_LEADER_ELECTION": "0"}).write_timeout == 0


def test_the_electors_news_reaches_the_journal():
    """Who leads and every transition must be in the journal: the elector says it with `logging`
    at INFO, which Python drops unless the process configures a handler."""
    code = ("import logging; from cnpa_controller import logs; logs.setup();"
            " log = logging.getLogger('cnpa_controller.leader');"
            " log.info('host-a: became leader on lease cnpa-system/cnpa-op');"
            " log.debug('not this')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, check=True)
    assert re.fullmatch(r"\S+Z INFO cnpa-op: host-a: became leader on lease cnpa-system/cnpa-op\n",
                        proc.stderr), proc.stderr


def test_the_version_is_the_collection_s():
    import yaml

    import cnpa_controller

    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    assert cnpa_controller.__version__ == galaxy["version"]


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CNPA_", "KUBECONFIG"))}
    return {**env, "KUBECONFIG": "/nonexistent/kubeconfig", **extra}


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cnpa_controller", *args], cwd=ROOT,
                          env=env or _env(), capture_output=True, text=True, timeout=60)


def _config(argv: list, env: dict):
    """What main() reads from these flags over this environment."""
    env = dict(env)
    flags = from_flags(parser().parse_args(argv), env)
    return read_config(env, flags)


def test_flags_win_over_the_environment():
    env = {"CNPA_WORKERS": "8", "CNPA_LEADER_ELECTION": "1", "CNPA_LEASE_NAME": "from-env",
           "CNPA_BASE_DIR": "/env", "KUBECONFIG": "/env/kubeconfig"}
    conf = _config(["--workers", "4", "--no-leader-election", "--kubeconfig", "/flag/kubeconfig",
                    "--archive-dir", "/flag/archive"], env)
    assert conf.workers == 4 and conf.election is False
    assert conf.kubeconfig == "/flag/kubeconfig"
    assert conf.archive_dir == "/flag/archive"
    assert conf.lease.name == "from-env"  # no flag: the variable still counts
    assert _config(["--leader-election"], {"CNPA_LEADER_ELECTION": "0"}).election is True
    assert _config([], env).workers == 8


def test_every_setting_read_has_a_flag():
    """A setting added to read_config without its flag would be the one a flag cannot set."""
    import inspect

    from cnpa_controller import config
    from cnpa_controller.__main__ import main

    # What reads the variables: everything in config.py after the table of them, and main().
    source = inspect.getsource(config).split("\ndef named(", 1)[1] + inspect.getsource(main)
    read = set(re.findall(r"\b(CNPA_[A-Z_]+|KUBECONFIG)\b", source))
    with_flag = {var for _flag, var, *_rest in OPTIONS}
    assert read == with_flag
    for flag, var, *_rest in OPTIONS:
        assert flag == "--" + var.removeprefix("CNPA_").lower().replace("_", "-")


@pytest.mark.parametrize(("args", "named"), [
    (["--workers", "0"], "--workers='0'"),
    (["--request-timeout", "soon"], "--request-timeout='soon'"),
    (["--event-namespace", "Not_A_Namespace"], "--event-namespace="),
    (["--archive-dir", "relative/dir"], "--archive-dir="),
    (["--renew-seconds", "20"], "--renew-seconds"),
    (["--metrics-address", "nowhere"], "--metrics-address="),
    (["--lease-identity", "h\u00f6st"], "--lease-identity="),
    (["--log-format", "xml"], "--log-format='xml'"),
    (["--log-level", "loud"], "--log-level='loud'"),
    (["--kubeconfig", "/nonexistent/kubeconfig"], "--kubeconfig"),
    (["--once", "--kubeconfig", "/nonexistent/kubeconfig"], "--kubeconfig: /nonexistent/kubeconfig"),
])
def test_a_bad_flag_value_exits_3_naming_the_flag(args, named):
    # The variable is set as well, to a good value: the flag wins, and the message says which.
    proc = _run(*args, env=_env(CNPA_WORKERS="4"))
    assert proc.returncode == 3, proc.stderr
    assert named in proc.stderr and "CNPA_WORKERS" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("args", [["--twice"], ["--once", "--plan"], ["--workers"],
                                  ["--work", "4"], ["once"]])
def test_a_bad_command_line_is_usage_and_status_3_not_2(args):
    """2 is "the API server could not be read" to whoever runs a pass; argparse's own is 2."""
    proc = _run(*args)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith("usage: python3 -m cnpa_controller ") and " error: " in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["--once", "--help"]])
def test_help_and_version_need_no_api_server_and_no_kubernetes_client(tmp_path, args):
    """A kubernetes package that fails on import is first on the path, the kubeconfig names a
    server nobody answers at, and a setting is bad: none of it is looked at."""
    poison = tmp_path / "kubernetes"
    poison.mkdir()
    (poison / "__init__.py").write_text("raise ImportError('the kubernetes client was imported')\n")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                          "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
                          "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
                          "users: [{name: u, user: {token: t}}]\n")
    proc = _run(*args, env=_env(PYTHONPATH=str(tmp_path), KUBECONFIG=str(kubeconfig),
                                CNPA_WORKERS="0"))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    if args == ["--version"]:
        import cnpa_controller

        assert proc.stdout == f"python3 -m cnpa_controller {cnpa_controller.__version__}\n"
    else:
        assert proc.stdout.startswith("usage: python3 -m cnpa_controller ")
        assert "--workers N" in proc.stdout and "[CNPA_WORKERS]" in proc.stdout
        assert "Exit status of --once and --plan" in proc.stdout


def test_the_long_running_controller_needs_neither_the_kubernetes_client_nor_urllib3(tmp_path):
    """Both fail on import, first on the path: the controller runs (its watches retry against a
    server nobody answers at) and stops on SIGTERM, having imported neither."""
    for name in ("kubernetes", "urllib3"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('{name} was imported')\n")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                          "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
                          "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
                          "users: [{name: u, user: {token: t}}]\n")
    env = _env(PYTHONPATH=str(tmp_path), KUBECONFIG=str(kubeconfig), CNPA_LEADER_ELECTION="0",
               CNPA_ARCHIVE_DIR=str(tmp_path / "archive"))
    log = tmp_path / "stderr"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "cnpa_controller"], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while "list of TeamSpace failed" not in log.read_text() and proc.poll() is None:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0 and "was imported" not in log.read_text(), log.read_text()


def test_the_docs_quote_the_help_as_the_program_gives_it():
    """docs/architecture.md's copy of --help cannot drift from the program's. (On any terminal:
    the width is the program's, not COLUMNS'.)"""
    page = (ROOT / "docs/architecture.md").read_text()
    section = page.split("### Its command line\n", 1)[1]
    quoted = re.search(r"^```text\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)[1]
    proc = _run("--help", env=_env(COLUMNS="40"))
    assert proc.returncode == 0, proc.stderr
    assert quoted == proc.stdout, ("docs/architecture.md, 'Its command line': paste the output of "
                                   "`python3 -m cnpa_controller --help` there")
