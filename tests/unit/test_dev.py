"""dev.py's consent to reset the lab's objects (cnpa_lab_reset): given on its own test host,
asked on a terminal on a real k3s VM, never assumed without one."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest

import dev

CONSENT = ["-e", "cnpa_lab_reset=true"]


def _never_asked(prompt: str) -> str:
    raise AssertionError(f"asked {prompt!r} where nobody may be asked")


@pytest.mark.parametrize("reset", [False, True])
def test_own_test_host_always_consents_without_asking(reset):
    assert dev.lab_reset_args(own_testhost=True, reset=reset, interactive=True,
                              ask=_never_asked) == CONSENT


@pytest.mark.parametrize("interactive", [False, True])
def test_reset_flag_consents_without_asking(interactive):
    assert dev.lab_reset_args(own_testhost=False, reset=True, interactive=interactive,
                              ask=_never_asked) == CONSENT


def test_no_terminal_no_flag_gives_no_consent():
    assert dev.lab_reset_args(own_testhost=False, reset=False, interactive=False,
                              ask=_never_asked) == []


@pytest.mark.parametrize("answer,expected", [
    ("y", CONSENT), ("Y\n", CONSENT), (" yes ", CONSENT),
    ("", None), ("n", None), ("no", None), ("yess", None), ("sure", None)])
def test_terminal_asks_the_question_and_only_yes_consents(answer, expected):
    asked = []

    def ask(prompt: str) -> str:
        asked.append(prompt)
        return answer

    assert dev.lab_reset_args(own_testhost=False, reset=False, interactive=True, ask=ask) == expected
    assert asked == ["this removes TeamSpaces alpha/beta, their namespaces and the lab's evidence; "
                     "continue? [y/N] "]


def test_end_of_input_at_the_question_is_no():
    def ask(prompt: str) -> str:
        raise EOFError

    assert dev.lab_reset_args(own_testhost=False, reset=False, interactive=True, ask=ask) is None


# The command line: an argument dev.py does not know is refused before anything runs (`lab
# --check` must not run the whole lab); arguments after `--` are passed on as they are.

@pytest.fixture
def actions(monkeypatch):
    """Every action main() could take, recorded instead of done; root and apt-get present."""
    done = []
    monkeypatch.setattr(dev.os, "geteuid", lambda: 0)
    monkeypatch.setattr(dev.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(dev, "setup", lambda *a, **kw: done.append(("setup", a)))
    monkeypatch.setattr(dev, "prepared_in_background",
                        lambda: contextlib.nullcontext(done.append(("prepare",))))
    monkeypatch.setattr(dev, "apt_install", lambda *a: done.append(("apt_install", a)))
    monkeypatch.setattr(dev, "sh", lambda cmd, **kw: done.append(("sh", cmd)) or 0)
    monkeypatch.setattr(dev, "lint", lambda: done.append(("lint",)) or 0)
    monkeypatch.setattr(dev, "test", lambda extra, long=False:
                        done.append(("test", extra, long) if long else ("test", extra)) or 0)
    monkeypatch.setattr(dev, "lab", lambda destroy, reset, extra:
                        done.append(("lab", destroy, reset, extra)) or 0)

    def no_subprocess(*a, **kw):
        raise AssertionError(f"subprocess started: {a!r}")

    monkeypatch.setattr(dev.subprocess, "run", no_subprocess)
    monkeypatch.setattr(dev.subprocess, "Popen", no_subprocess)
    return done


@pytest.mark.parametrize("argv", [
    ["lab", "--check"],                 # --check is docs's: it would have run the whole lab
    ["lab", "--chek"],                  # a typo
    ["test", "-k", "name"],             # pytest's option without `--`
    ["test", "--destroy"],
    ["docs", "--reset"],
    ["docs", "--", "--write"],          # docs passes nothing on
    ["lint", "--", "-x"],
    ["deploy"],
])
def test_unknown_or_misplaced_argument_is_refused_with_usage_and_nothing_done(argv, actions, capsys):
    with pytest.raises(SystemExit) as exc:
        dev.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python3 dev.py {setup,lint,test,lab,docs}")
    assert "error:" in err
    assert actions == []


def test_long_belongs_to_test(actions, capsys):
    with pytest.raises(SystemExit):
        dev.main(["lab", "--long"])
    assert "--long belongs to `test`, not to `lab`" in capsys.readouterr().err
    assert actions == []


def test_the_long_forms_stretch_tests_that_exist(tmp_path):
    """Each variable of LONG_FORMS is read by a test that runs on every commit."""
    tests = "".join(p.read_text() for p in (dev.ROOT / "tests").rglob("test_*.py"))
    for var in dev.LONG_FORMS:
        assert f'"{var}"' in tests, var


def test_check_with_lab_names_the_command_it_belongs_to(actions, capsys):
    with pytest.raises(SystemExit):
        dev.main(["lab", "--check"])
    assert "--check belongs to `docs`, not to `lab`" in capsys.readouterr().err
    assert actions == []


@pytest.mark.parametrize("argv,expected", [
    (["test", "--", "-k", "name"], ("test", ["-k", "name"])),
    (["test", "--", "-n", "0", "--", "x"], ("test", ["-n", "0", "--", "x"])),
    (["test"], ("test", [])),
    (["test", "--long", "--", "-k", "soak"], ("test", ["-k", "soak"], True)),
    (["lab", "--", "-v", "--check"], ("lab", False, False, ["-v", "--check"])),
    (["lab", "--reset", "--", "-e", "x=1"], ("lab", False, True, ["-e", "x=1"])),
    (["lab", "--destroy"], ("lab", True, False, [])),
])
def test_arguments_after_double_dash_are_passed_on(argv, expected, actions):
    assert dev.main(argv) == 0
    assert actions[-1] == expected
    # The test hosts' cache starts filling before the virtualenv is made (dev.py test only).
    assert [a[0] for a in actions] == ["prepare"] * (expected[0] == "test") + ["setup", expected[0]]


def test_docs_check_still_compares_only(actions):
    assert dev.main(["docs", "--check"]) == 0
    assert actions[-1] == ("sh", [str(dev.BIN / "python"), "variable_docs.py", "--check"])


def test_the_checkout_is_importable_in_the_virtualenv_as_an_editable_install_makes_it(tmp_path):
    """The tests and the benchmark import cnpa_controller from where the role installs it from,
    and testhost and fixtures from the checkout, through the virtualenv alone: no path edits."""
    site = tmp_path / f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    site.mkdir(parents=True)
    pth = dev.link_checkout(tmp_path)
    assert pth.parent == site and dev.link_checkout(tmp_path) == pth   # again: the same file
    code = ("import site, sys; site.addsitedir(sys.argv[1]); "
            "import cnpa_controller, fixtures, testhost; print(cnpa_controller.__file__)")
    # -I -S: neither this process's path nor its virtualenv, only that site directory.
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(site)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(dev.ROOT / "roles/cnpa_reconciler/files/cnpa_controller"
                                      / "__init__.py")


def test_no_two_test_modules_share_a_name():
    """pytest imports each test directory's modules by their base name (no __init__.py, the
    default import mode): a second tests/**/test_x.py fails to collect, and under xdist the run
    goes on without that module's tests."""
    names: dict[str, list[str]] = {}
    for path in sorted((dev.ROOT / "tests").rglob("*.py")):
        if path.name != "conftest.py" and ".venv" not in path.parts:
            names.setdefault(path.name, []).append(str(path.relative_to(dev.ROOT)))
    assert not {k: v for k, v in names.items() if len(v) > 1}


def test_the_background_prepare_needs_no_virtualenv():
    """dev.py test starts `python3 -m testhost prepare` with the interpreter running dev.py before
    the virtualenv exists: every testhost module imports with no site-packages at all (-S)."""
    code = ("import importlib, pkgutil, testhost\n"
            "for m in pkgutil.iter_modules(testhost.__path__):\n"
            "    importlib.import_module('testhost.' + m.name)\n"
            "import sys; print(sorted(n for n in sys.modules if n.startswith('testhost.')))")
    proc = subprocess.run([sys.executable, "-S", "-c", code], cwd=dev.ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "testhost.prepare" in proc.stdout and "testhost.build" in proc.stdout, proc.stdout
