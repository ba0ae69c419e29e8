"""Skips for tests that need a peer tool: circuit-tracer's virtualenv, Chromium or Playwright.

Each skips with the reason, or fails instead when CI asks for the tool (CIRCUITGRAPH_REQUIRE_CT,
CIRCUITGRAPH_REQUIRE_BROWSER)."""

from __future__ import annotations

import os

import pytest

from circuitgraph.testing.browser import chromium_unavailable, playwright_unavailable

#: the graphs compared with circuit-tracer 0.5.0: the two shipped fixtures and two tiny random
#: bundles with skip transcoders (GPT-2 style, ReLU; Llama style, JumpReLU)
CT_CASES = ("example-gpt2", "example-llama", "tiny-gpt2-skip", "tiny-llama-skip-jr")


def circuit_tracer_or_skip() -> None:
    """Skip the calling test, with the reason, when circuit-tracer's virtualenv is missing; fail
    instead when CIRCUITGRAPH_REQUIRE_CT is set (as in CI). Every circuit-tracer test calls it."""
    from circuitgraph.testing.circuit_tracer import circuit_tracer_unavailable

    reason = circuit_tracer_unavailable()
    if reason:
        if os.environ.get("CIRCUITGRAPH_REQUIRE_CT"):
            pytest.fail(reason + " (CIRCUITGRAPH_REQUIRE_CT is set)")
        pytest.skip(reason)


def browser_or_skip() -> None:
    reason = chromium_unavailable()
    if reason:
        if os.environ.get("CIRCUITGRAPH_REQUIRE_BROWSER"):
            pytest.fail(reason + " (CIRCUITGRAPH_REQUIRE_BROWSER is set)")
        pytest.skip(reason)


def playwright_or_skip() -> None:
    reason = playwright_unavailable()
    if reason:
        if os.environ.get("CIRCUITGRAPH_REQUIRE_BROWSER"):
            pytest.fail(reason + " (CIRCUITGRAPH_REQUIRE_BROWSER is set)")
        pytest.skip(reason)
