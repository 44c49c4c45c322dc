"""dev.py's consent to reset the lab's objects (cnpa_lab_reset): given on its own test host,
asked on a terminal on a real k3s VM, never assumed without one."""

from __future__ import annotations

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
