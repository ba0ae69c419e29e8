"""Hub names without a network (issue 20): one line at once, not a minute of "Retrying in 8s".

The hub's endpoint is pointed at a closed port of this machine's loopback (HF_ENDPOINT=
http://127.0.0.1:9): nothing leaves the machine and the connection is refused at once."""

from __future__ import annotations

import socket
import time

import pytest

import circuitgraph
from circuitgraph import _hub
from circuitgraph.errors import LoadError

DEAD = "http://127.0.0.1:9"


@pytest.fixture
def no_hub(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", DEAD)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(_hub, "_reachable", set())
    # should anything still try the hub, fail at once instead of retrying
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", DEAD)


def _spec(**model):
    return {"format_version": 1, "model": model, "prompt": {"tokens": [1, 2, 3]},
            "targets": [{"top_logits": {"max_n": 1}}]}


def test_model_name_without_hub_is_one_line_at_once(no_hub):
    import transformer_lens  # noqa: F401  (its import takes seconds on a busy machine: not what is timed)

    t0 = time.perf_counter()
    with pytest.raises(LoadError) as info:
        circuitgraph.run(_spec(name="gpt2"))
    took = time.perf_counter() - t0
    text = str(info.value)
    assert took < _hub.PROBE_TIMEOUT_S + 3, took
    assert "HF_HUB_OFFLINE=1" in text and "model: {path: DIR}" in text and "127.0.0.1:9" in text
    assert "model: {name: gpt2}" in text and "\n" not in text


def test_hub_dictionary_without_hub_is_one_line(no_hub):
    from circuitgraph.dictionaries.hub import resolve_hf_dictionary

    with pytest.raises(LoadError, match=r"transcoders: \{hf: org/repo\} needs the Hugging Face hub.*HF_HUB_OFFLINE=1"):
        resolve_hf_dictionary("org/repo")


def test_offline_asks_nothing(no_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(*a, **k):
        raise AssertionError("HF_HUB_OFFLINE is set: no connection may be opened")

    monkeypatch.setattr(socket, "create_connection", refuse)
    _hub.require_hub("model: {name: gpt2}")


def test_a_silent_endpoint_times_out_within_the_probe(no_hub, monkeypatch):
    monkeypatch.setattr(_hub, "PROBE_TIMEOUT_S", 0.2)

    def hang(address, timeout=None):
        assert timeout == 0.2
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", hang)
    with pytest.raises(LoadError, match="timed out, within 0.2 s"):
        _hub.require_hub("model: {name: gpt2}")


def test_a_proxy_is_probed_instead_of_the_hub(no_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "https://huggingface.co")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    seen = []

    def record(address, timeout=None):
        seen.append(address)
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(socket, "create_connection", record)
    with pytest.raises(LoadError, match="the proxy 127.0.0.1:9"):
        _hub.require_hub("x")
    assert seen == [("127.0.0.1", 9)]
