"""Freed heap goes back to the system where glibc can give it back."""

from __future__ import annotations

import ctypes

import pytest

from delayservice.precise.wheel import heap_trim


def test_release_reports_whether_the_c_library_can_trim():
    try:
        ctypes.CDLL(None).malloc_trim  # noqa: B018
    except AttributeError:
        pytest.skip("no malloc_trim here (not glibc)")
    assert heap_trim.release_free_heap() is True


def test_without_malloc_trim_nothing_happens(monkeypatch):
    monkeypatch.setattr(heap_trim, "_malloc_trim", lambda: None)
    assert heap_trim.release_free_heap() is False
