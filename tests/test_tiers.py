"""The tier marks (tests/helpers/markers.py) follow what a test runs: its own code, its fixtures and
the tests/ functions those call, through helpers cached with functools.cache."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest

from tests.helpers.markers import tiers
from tests.helpers.peers import browser_or_skip, circuit_tracer_or_skip


def _item(function, fixturenames=(), nodeid="tests/test_x.py::test_x", real=False):
    return SimpleNamespace(function=function, _fixtureinfo=None, fixturenames=list(fixturenames), nodeid=nodeid,
                           name=function.__name__, originalname=function.__name__,
                           get_closest_marker=lambda name: object() if real and name == "real" else None)


def _needs_circuit_tracer():
    circuit_tracer_or_skip()


@functools.cache
def _cached_browser_helper():
    browser_or_skip()


def _spec_with_an_executor():
    return {"executor": {"kind": "local", "workers": 2}, "dataset": []}


def test_a_test_calling_a_skip_helper_is_in_its_tier():
    def test_direct():
        circuit_tracer_or_skip()

    def test_through_a_helper():
        _needs_circuit_tracer()

    def test_through_a_cached_helper():
        _cached_browser_helper()

    # the nested test functions read module globals like a test module's functions do
    assert tiers(_item(test_direct)) == {"peer"}
    assert tiers(_item(test_through_a_helper)) == {"peer"}
    assert tiers(_item(test_through_a_cached_helper)) == {"browser"}


def test_fixtures_executors_and_the_real_tier():
    def test_plain():
        return 1 + 1

    def test_dataset():
        return _spec_with_an_executor()

    assert tiers(_item(test_plain)) == set()
    assert tiers(_item(test_plain, fixturenames=["circuit_tracer_graphs"])) == {"peer"}
    assert tiers(_item(test_dataset)) == {"processes"}
    assert tiers(_item(test_plain, real=True)) == {"slow"}
    assert tiers(_item(test_plain, nodeid="tests/test_typecheck.py::test_plain")) == {"slow"}


@pytest.mark.parametrize("marker", ["slow", "peer", "browser", "processes"])
def test_the_tiers_are_registered(pytestconfig, marker):
    assert any(line.startswith(marker + ":") for line in pytestconfig.getini("markers"))
