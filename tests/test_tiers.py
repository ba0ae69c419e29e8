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


def _direct():
    circuit_tracer_or_skip()


def _through_a_helper():
    _needs_circuit_tracer()


def _through_a_cached_helper():
    _cached_browser_helper()


def _plain():
    return 1 + 1


def _dataset():
    return _spec_with_an_executor()


#: the cases, looked up by name so that these tests themselves stay in the fast tier (the marks
#: follow the functions a test names, not the values of a dict it reads)
CASES = {f.__name__: f for f in (_direct, _through_a_helper, _through_a_cached_helper, _plain, _dataset)}


def test_a_test_calling_a_skip_helper_is_in_its_tier():
    assert tiers(_item(CASES["_direct"])) == {"peer"}
    assert tiers(_item(CASES["_through_a_helper"])) == {"peer"}
    assert tiers(_item(CASES["_through_a_cached_helper"])) == {"browser"}


def test_fixtures_executors_and_the_real_tier():
    plain = CASES["_plain"]
    assert tiers(_item(plain)) == set()
    assert tiers(_item(plain, fixturenames=["circuit_tracer_graphs"])) == {"peer"}
    assert tiers(_item(CASES["_dataset"])) == {"processes"}
    assert tiers(_item(plain, real=True)) == {"slow"}
    assert tiers(_item(plain, nodeid="tests/test_typecheck.py::test_plain")) == {"slow"}


@pytest.mark.parametrize("marker", ["slow", "peer", "browser", "processes"])
def test_the_tiers_are_registered(pytestconfig, marker):
    assert any(line.startswith(marker + ":") for line in pytestconfig.getini("markers"))
