"""bestofn.report.fresh_process: a call in a fresh interpreter, its answer, its errors and its
deadline; and that a lock another thread holds here does not reach the child (a forked child
would inherit it held, by no one, and wait forever)."""

from __future__ import annotations

import os
import threading

import pytest
from helpers import held_elsewhere

from bestofn.report.fresh_process import FreshProcess

LOCK = threading.Lock()


def _take_the_lock() -> int:
    with LOCK:
        return os.getpid()


def _chatty_sum(a: int, b: int) -> int:
    print("this goes to stderr, not into the answer")
    os.write(1, b"so does a write to fd 1\n")
    return a + b


def _fail() -> None:
    raise ValueError("the child's own error")


def _never_answer() -> None:
    threading.Event().wait()


def test_the_child_answers_and_its_prints_stay_out_of_the_answer(capsys):
    with FreshProcess(_chatty_sum, 2, 3, timeout_s=60) as call:
        assert call.result() == 5
    assert "this goes to stderr" in capsys.readouterr().err  # handed on to this stderr


def test_a_lock_held_by_another_thread_here_does_not_block_the_child():
    # the deadline only turns a regression (a forked child) into a failure, not a hang
    with held_elsewhere(LOCK), FreshProcess(_take_the_lock, timeout_s=60) as call:
        assert call.result() != os.getpid()


def test_the_childs_error_is_raised_here_with_its_traceback():
    with FreshProcess(_fail, timeout_s=60, label="the test's child") as call:
        with pytest.raises(RuntimeError, match="the test's child failed") as err:
            call.result()
    assert "ValueError: the child's own error" in str(err.value)


def test_a_child_with_no_answer_by_the_deadline_is_stopped_and_says_so():
    with FreshProcess(_never_answer, timeout_s=1, label="the silent child") as call:
        with pytest.raises(TimeoutError, match="the silent child gave no answer in 1 s"):
            call.result()
        assert call._proc.returncode is not None  # stopped, not left running


def test_a_child_still_running_when_the_caller_fails_is_stopped():
    with pytest.raises(KeyError):
        with FreshProcess(_never_answer, timeout_s=60) as call:
            raise KeyError("the caller's half failed")
    assert call._proc.returncode is not None


def test_a_function_a_fresh_interpreter_cannot_import_is_refused_at_once():
    with pytest.raises(ValueError, match="define it at module level"):
        FreshProcess(lambda: None, timeout_s=1)
