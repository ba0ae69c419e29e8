"""Fingerprint every output the fast specs write, to prove a refactoring leaves them byte-identical.

Run::

    python scripts/output_fingerprint.py --out FINGERPRINT.json        # record
    python scripts/output_fingerprint.py --check FINGERPRINT.json      # compare; exit 1 on a change

What is fingerprinted (tiny and built-in demo models only; a few minutes on one core):

* every ``examples/*.yaml`` spec, run by ``circuitgraph.run`` from a copy of ``examples/`` in a
  fixed folder (``--work``, default ``circuitgraph-fingerprint`` in the system's temporary folder: the same folder every time,
  so paths written into the outputs compare equal), every file it writes hashed;
* the Python API's file and display outputs of the demo graph and its results
  (``to_json``, ``to_dot``, ``_repr_html_``, ``_repr_svg_``, the results' ``_repr_html_``);
* the explorer's JSON API over the written outputs (``list_graphs``, each graph's view and first
  node, ``supernodes``, ``qk``, ``steering``, a ``diff``, a pinned ``export`` in each format).

Files are hashed as bytes (sha256), except JSON files (and JSON lines, and JSON API answers),
which are hashed after removing the fields that legitimately change between runs
(:data:`VOLATILE_KEYS` and :data:`VOLATILE_PREFIXES`: timestamps, durations, memory peaks,
package versions, host facts, files' modification times) at any depth; Parquet tables are hashed by their rows (pyarrow's ``to_pylist``), not their bytes, since
their footers name the writer's version; everything else (SVG, PNG, DOT, HTML, .npz) as bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

#: the keys whose values legitimately differ between two identical runs, removed at any depth of
#: a JSON output before hashing
VOLATILE_KEYS = frozenset({
    # time
    "created", "created_at", "timestamp", "started", "started_at", "finished", "finished_at", "date", "time",
    "seconds", "duration", "duration_s", "elapsed", "elapsed_s", "wall_s", "wall_seconds", "cpu_s", "cpu_seconds",
    "stage_seconds", "timings", "timing", "rows_per_second", "prompts_per_minute", "throughput",
    # memory measured on this machine
    "peak_rss", "peak_rss_bytes", "peak_rss_mb", "peak_rss_gb", "rss", "rss_bytes", "max_rss", "memory",
    "stage_memory", "peak_bytes",
    # versions and host
    "versions", "version", "circuitgraph_version", "python", "platform", "hostname", "host", "pid", "git",
    "torch_threads", "threads",
    # file records (.circuitgraph-outputs.json: a written file's modification time)
    "mtime_ns", "mtime",
})
#: key prefixes removed the same way (a dataset row's per-stage seconds: ``time_graph``, ``time_total``...)
VOLATILE_PREFIXES = ("time_",)


def _volatile(key: str) -> bool:
    return key in VOLATILE_KEYS or key.startswith(VOLATILE_PREFIXES)


def _strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if not _volatile(k)}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _canonical_json(obj: Any) -> bytes:
    return json.dumps(_strip(obj), sort_keys=True, ensure_ascii=False, allow_nan=True).encode("utf-8")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hash_file(path: Path) -> str:
    data = path.read_bytes()
    suffix = path.suffix.lower()
    if suffix == ".json":
        try:
            return _digest(_canonical_json(json.loads(data)))
        except ValueError:
            return _digest(data)
    if suffix == ".jsonl":
        lines = [line for line in data.decode("utf-8").splitlines() if line.strip()]
        return _digest(b"\n".join(_canonical_json(json.loads(line)) for line in lines))
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        return _digest(_canonical_json({"schema": [f"{f.name}:{f.type}" for f in table.schema],
                                        "rows": table.to_pylist()}))
    return _digest(data)


def _run_examples(work: Path, only: set[str] | None) -> dict[str, str]:
    import circuitgraph

    examples = work / "examples"
    out: dict[str, str] = {}
    for spec_path in sorted(examples.glob("*.yaml")):
        if only and spec_path.stem not in only:
            continue
        before = {p for p in work.rglob("*") if p.is_file()}
        print(f"running {spec_path.name}", file=sys.stderr, flush=True)
        result = circuitgraph.run(spec_path)
        failures = getattr(result, "failures", None)
        out[f"run:{spec_path.name}:failures"] = _digest(_canonical_json(failures or []))
        for path in sorted(p for p in work.rglob("*") if p.is_file() and p not in before):
            out[f"file:{path.relative_to(work).as_posix()}"] = _hash_file(path)
    return out


def _python_api(work: Path) -> dict[str, str]:
    import circuitgraph

    spec = work / "examples" / "demo.yaml"
    result = circuitgraph.run(spec)
    graph = result.graph
    out = {
        "api:graph.to_json": _digest(_canonical_json(json.loads(graph.to_json()))),
        "api:graph.to_dot": _digest(graph.to_dot().encode()),
        "api:graph._repr_html_": _digest(graph._repr_html_().encode()),
        "api:graph._repr_svg_": _digest((graph._repr_svg_() or "").encode()),
        "api:full_graph.to_json": _digest(_canonical_json(json.loads(result.full_graph.to_json()))),
    }
    for group in ("queries", "validation"):
        for i, entry in enumerate(getattr(result, group)):
            res = entry.get("result")
            if hasattr(res, "_repr_html_"):
                out[f"api:{group}[{i}].result._repr_html_"] = _digest(res._repr_html_().encode())
    return out


def _explorer(work: Path) -> dict[str, str]:
    from circuitgraph.serve.api import ApiError, Explorer, explorer_kinds
    from circuitgraph.serve.catalog import Catalog

    api = Explorer(Catalog(work / "out"))
    out: dict[str, str] = {}

    def record(key: str, call: Any) -> Any:
        try:
            answer = call()
        except ApiError as exc:
            out[key] = _digest(f"ApiError {exc.status} {exc}".encode())
            return None
        if hasattr(answer, "data"):  # a Download
            data = answer.data
            out[key] = (_digest(_canonical_json(json.loads(data))) if answer.content_type == "application/json"
                        else _digest(data))
        else:
            out[key] = _digest(_canonical_json(answer))
        return answer

    listing = record("explorer:list_graphs", lambda: api.list_graphs({}))
    record("explorer:registries", lambda: api.registries({}))
    names = [g["name"] for g in (listing or {}).get("graphs", [])]
    for name in names:
        view = record(f"explorer:graph_view:{name}", lambda n=name: api.graph_view(n, {}))
        record(f"explorer:supernodes:{name}", lambda n=name: api.supernode_proposals(n, {}))
        record(f"explorer:qk:{name}", lambda n=name: api.qk(n, {}))
        record(f"explorer:steering:{name}", lambda n=name: api.steering(n, {}))
        nodes = [n["id"] for n in (view or {}).get("nodes", [])][:3]
        if nodes:
            record(f"explorer:node:{name}", lambda n=name, i=nodes[0]: api.node(n, i, {}))
            ids = ",".join(nodes)
            for fmt in sorted(k.key for k in explorer_kinds()):
                record(f"explorer:export:{fmt}:{name}",
                       lambda n=name, f=fmt, ids=ids: api.export(n, {"format": [f], "nodes": [ids]}))
    if len(names) >= 2:
        record("explorer:diff", lambda: api.diff({"a": [names[0]], "b": [names[1]], "allow_different": ["true"]}))
    return out


def fingerprint(work: Path, only: set[str] | None = None) -> dict[str, str]:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    shutil.copytree(REPO / "examples", work / "examples")
    out = _run_examples(work, only)
    out.update(_python_api(work))
    out.update(_explorer(work))
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "circuitgraph-fingerprint")
    parser.add_argument("--out", type=Path, help="write the fingerprint here")
    parser.add_argument("--check", type=Path, help="compare with this fingerprint; exit 1 on any difference")
    parser.add_argument("--only", nargs="*", help="example spec stems to run (default: all)")
    args = parser.parse_args(argv)
    got = fingerprint(args.work, set(args.only) if args.only else None)
    if args.out:
        args.out.write_text(json.dumps(got, indent=1) + "\n")
    if args.check:
        want = json.loads(args.check.read_text())
        changed = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        for k in changed:
            print(f"CHANGED {k}: {want.get(k, 'absent')[:12]} -> {got.get(k, 'absent')[:12]}")
        print(f"{len(got)} outputs, {len(changed)} changed")
        return 1 if changed else 0
    print(f"{len(got)} outputs fingerprinted")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
