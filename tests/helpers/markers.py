"""The test tiers: ``peer``, ``browser``, ``processes`` and ``slow`` marks, given at collection.

A test gets a mark when the code it runs names what the tier needs: the test function, the
fixtures it uses, and the functions of tests/ that those call (followed through their global
names), so a new test that calls ``circuit_tracer_or_skip()`` or writes a dataset spec with an
``executor`` is in its tier without anyone remembering to mark it. ``real`` tests are ``slow`` too;
:data:`SLOW` names the other slow tests (the slowest of a full run, over about 20 s on CI's machine).
``pytest -m "not slow and not peer and not browser and not processes"`` is the fast tier.
"""

from __future__ import annotations

import types
from collections.abc import Iterable

import pytest

#: global names (functions, fixtures) that put a test in a tier
NAMES = {
    "peer": {"circuit_tracer_or_skip", "circuit_tracer_graphs", "run_circuit_tracer", "load_ct_graph"},
    "browser": {"browser_or_skip", "playwright_or_skip", "chromium_unavailable", "playwright_unavailable"},
    "processes": set(),
}
#: string constants that put a test in a tier: a dataset or feature spec's executor starts processes
STRINGS = {"processes": {"executor"}}
#: slow tests other than the real-model tier: test modules, or module::test (any parameters)
SLOW: set[str] = {"test_typecheck"}


def _codes(code: types.CodeType) -> Iterable[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _strings(consts: Iterable[object]) -> Iterable[str]:
    for const in consts:
        if isinstance(const, str):
            yield const
        elif isinstance(const, (tuple, frozenset)):  # a dict literal's keys are one tuple constant
            yield from _strings(const)


def _from_tests(obj: object) -> bool:
    module = getattr(obj, "__module__", "") or ""
    return module == "conftest" or module.startswith("tests")


def _names_and_strings(functions: Iterable[object]) -> tuple[set[str], set[str]]:
    """Global names and string constants of ``functions`` and of the tests/ functions they name."""
    names: set[str] = set()
    strings: set[str] = set()
    todo = [f for f in functions if isinstance(f, types.FunctionType)]
    seen: set[int] = set()
    while todo:
        func = todo.pop()
        if id(func) in seen:
            continue
        seen.add(id(func))
        for code in _codes(func.__code__):
            names.update(code.co_names)
            strings.update(_strings(code.co_consts))
            for name in code.co_names:
                target = func.__globals__.get(name)
                target = getattr(target, "__wrapped__", target)  # functools.cache
                if isinstance(target, types.FunctionType) and _from_tests(target):
                    todo.append(target)
    return names, strings


def tiers(item: pytest.Item) -> set[str]:
    """The tier marks ``item`` gets (besides those it was given by hand)."""
    function = getattr(item, "function", None)
    functions: list[object] = [function] if function is not None else []
    info = getattr(item, "_fixtureinfo", None)
    fixturenames = set(getattr(item, "fixturenames", ()))
    for defs in (info.name2fixturedefs.values() if info is not None else ()):
        functions += [d.func for d in defs if _from_tests(d.func)]
    names, strings = _names_and_strings(functions)
    names |= fixturenames
    out = {tier for tier, wanted in NAMES.items() if names & wanted}
    out |= {tier for tier, wanted in STRINGS.items() if strings & wanted}
    module = item.nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
    test = getattr(item, "originalname", item.name)
    if item.get_closest_marker("real") or module in SLOW or f"{module}::{test}" in SLOW:
        out.add("slow")
    return out


def mark_tiers(items: Iterable[pytest.Item]) -> None:
    for item in items:
        for tier in sorted(tiers(item)):
            item.add_marker(getattr(pytest.mark, tier))
