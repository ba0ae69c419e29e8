"""What ``circuitgraph validate`` checks without the weights: the spec against the model's and
the dictionaries' config files and the tokenizer.

:func:`preflight` reads, once, what the files say (:class:`Preflight`: the model folder's
``config.json`` as :class:`ModelFacts`, in the TransformerLens layout this package writes or a
Hugging Face ``save_pretrained`` one; the dictionary's config files, see
:mod:`circuitgraph.adapters.dictionary_fit`; the tokenizer and the prompt's tokens) and runs every
function of :data:`PREFLIGHT_CHECKS` on it.  Each check returns problems ``(location, message)``;
all of them are reported at once, like the rest of ``validate``.  A fact that cannot be read (no
config, a hub name, an unreadable file) is ``None`` and the checks that need it are skipped: the
run still checks everything when the model is loaded.

Adding a check is one function::

    @preflight_check
    def my_check(p: Preflight) -> list[tuple[str, str]]:
        if p.model is None or p.model.model_type is None:
            return []
        return [] if p.model.model_type in SUPPORTED else [("model.path", "...")]

No torch is imported here: ``validate`` stays fast.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from circuitgraph._io import read_json_file
from circuitgraph.adapters.dictionary_fit import DeclaredDictionary, fit_problems, read_declared
from circuitgraph.adapters.dictionary_sources import existing_dictionary_folder
from circuitgraph.adapters.model_sources import existing_model_folder, model_source
from circuitgraph.adapters.tokenizer import Tokenizer, prompt_ids, resolve_tokenizer_dir
from circuitgraph.errors import CircuitGraphError
from circuitgraph.spec import Spec
from circuitgraph.spec.dataset import parse_rows, read_dataset_rows
from circuitgraph.spec.references import UnitReference, unit_references
from circuitgraph.spec.targets import LogitDiffTarget, LogitTarget, TopLogitsTarget

__all__ = ["ModelFacts", "Preflight", "PreflightReport", "PREFLIGHT_CHECKS", "preflight_check", "preflight",
           "preflight_report", "read_model_facts", "run_time_notes", "leading_space_warnings"]

Problems = list[tuple[str, str]]


@dataclass(frozen=True)
class ModelFacts:
    """What a model folder's ``config.json`` says (``None``: it does not say).

    ``layout`` is ``"transformer_lens"`` (HookedTransformerConfig fields, as this package saves
    them) or ``"hf"`` (a Hugging Face ``save_pretrained`` config); ``raw`` is the JSON as read,
    for checks that need another field (``model_type``, ``architectures``...)."""

    file: Path
    layout: str
    n_layers: int | None
    n_ctx: int | None
    d_vocab: int | None
    d_model: int | None
    model_name: str | None
    model_type: str | None
    raw: dict[str, Any] = field(repr=False, default_factory=dict)
    #: attention heads per layer (query heads)
    n_heads: int | None = None
    #: MLP neurons per layer (``num_experts * d_mlp`` on mixture-of-experts layers, as the graph numbers them)
    n_neurons: int | None = None
    #: the config keys that give ``n_heads`` and ``n_neurons`` (for messages)
    sources: dict[str, str] = field(repr=False, default_factory=dict)

    def layers_text(self) -> str:
        n = self.n_layers
        if n is None:
            return f"the number of layers is not known ({self.file.name})"
        return f"the model has {n} layers (0-{n - 1}; {self.file.name})"


def _first_key(cfg: dict[str, Any], *keys: str) -> tuple[int, str] | None:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, key
    return None


def _unit_sizes(cfg: dict[str, Any], layout: str) -> tuple[int | None, int | None, dict[str, str]]:
    """``(n_heads, n_neurons, sources)`` of a config (``None`` where it does not say)."""
    if layout == "transformer_lens":
        heads = _first_key(cfg, "n_heads")
        mlp = _first_key(cfg, "d_mlp")
        experts = _first_key(cfg, "num_experts")
    else:
        heads = _first_key(cfg, "num_attention_heads", "n_head", "num_heads", "n_heads")
        mlp = _first_key(cfg, "moe_intermediate_size", "intermediate_size", "n_inner", "ffn_dim", "d_ff")
        experts = _first_key(cfg, "num_local_experts", "num_experts")
        if mlp is None and cfg.get("model_type") in ("gpt2", "gptj") and _first_key(cfg, "n_embd"):
            mlp = (4 * cfg["n_embd"], "4 x n_embd")  # GPT-2's n_inner: null
    sources = {}
    if heads:
        sources["attention_head"] = heads[1]
    n_neurons = None
    if mlp:
        n_neurons = mlp[0] * (experts[0] if experts else 1)
        sources["neuron"] = f"{experts[1]} x {mlp[1]}" if experts else mlp[1]
    return (heads[0] if heads else None), n_neurons, sources


def _first_int(cfg: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def read_model_facts(model_dir: Path) -> ModelFacts | None:
    """The facts of ``model_dir/config.json`` (``None`` when there is none or it is not a JSON
    object: the loader reports that with its own message)."""
    file = model_dir / "config.json"
    if not file.is_file():
        return None
    try:
        raw = read_json_file(file, "model config")
    except CircuitGraphError:
        return None
    if not isinstance(raw, dict):
        return None
    if "n_layers" in raw or "d_model" in raw:
        heads, neurons, sources = _unit_sizes(raw, "transformer_lens")
        return ModelFacts(file, "transformer_lens", _first_int(raw, "n_layers"), _first_int(raw, "n_ctx"),
                          _first_int(raw, "d_vocab"), _first_int(raw, "d_model"),
                          raw.get("model_name") if isinstance(raw.get("model_name"), str) else None,
                          None, raw, heads, neurons, sources)
    cfg = raw
    if isinstance(raw.get("text_config"), dict):  # multimodal configs nest the language model's
        cfg = {**raw["text_config"], **{k: v for k, v in raw.items() if k != "text_config" and k not in
                                       raw["text_config"]}}
    name = raw.get("_name_or_path")
    heads, neurons, sources = _unit_sizes(cfg, "hf")
    return ModelFacts(
        file, "hf",
        _first_int(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers"),
        _first_int(cfg, "max_position_embeddings", "n_positions", "n_ctx", "seq_length"),
        _first_int(cfg, "vocab_size"),
        _first_int(cfg, "hidden_size", "n_embd", "d_model"),
        Path(name).name if isinstance(name, str) and name else None,
        raw.get("model_type") if isinstance(raw.get("model_type"), str) else None,
        raw, heads, neurons, sources,
    )


@dataclass
class Preflight:
    """What the checks read: the spec and what its files say (``None`` where they cannot say)."""

    spec: Spec
    model: ModelFacts | None = None
    dictionary: DeclaredDictionary | None = None
    dictionary_where: str = "transcoders"
    tokenizer: Tokenizer | None = None
    #: the main prompt's token ids (``None``: a dataset, or no tokenizer for a text prompt)
    prompt_tokens: list[int] | None = None
    #: the layers the dictionary folder holds (``None``: unknown)
    dictionary_layers: set[int] | None = None
    #: what cannot be checked without the weights, or without files it could not read: lines
    #: ``validate`` prints as ``checked at run time: ...``
    unchecked: list[str] = field(default_factory=list)


#: every preflight check, run in order by :func:`preflight`; add one with :func:`preflight_check`
PREFLIGHT_CHECKS: list[Callable[[Preflight], Problems]] = []


def preflight_check(fn: Callable[[Preflight], Problems]) -> Callable[[Preflight], Problems]:
    """Register ``fn`` in :data:`PREFLIGHT_CHECKS` (a decorator)."""
    PREFLIGHT_CHECKS.append(fn)
    return fn


# ---------------------------------------------------------------------------- reading the files
def _model_dir(spec: Spec) -> Path | None:
    # None for a hub name (its config is not read without the hub), a GGUF file not converted yet and
    # a pretrained model not fetched yet
    return existing_model_folder(spec.model)


def _tokenizer(model_dir: Path) -> Tokenizer | None:
    try:
        tok_dir = resolve_tokenizer_dir(model_dir / "tokenizer")
        if tok_dir is None and (model_dir / "tokenizer.json").is_file():  # a save_pretrained folder
            tok_dir = model_dir
        return Tokenizer.from_dir(tok_dir) if tok_dir is not None else None
    except CircuitGraphError:
        return None  # check_input_files reports a broken tokenizer


def _prompt_tokens(spec: Spec, tokenizer: Tokenizer | None) -> list[int] | None:
    return tokens_of(spec.prompt, tokenizer)


def tokens_of(prompt: Any, tokenizer: Tokenizer | None) -> list[int] | None:
    """A spec prompt's token ids as the run makes them (``None``: no prompt, or a text without a
    tokenizer)."""
    if prompt is None:
        return None
    tokens = getattr(prompt, "tokens", None)
    if tokens is not None:
        return list(tokens)
    if tokenizer is None:
        return None
    try:
        return prompt_ids(tokenizer, prompt.text, prompt.prepend_bos)
    except CircuitGraphError:
        return None  # the run reports a text that cannot be encoded


def gather(spec: Spec) -> Preflight:
    """Read what :class:`Preflight` holds for ``spec`` (nothing heavy: config files and the tokenizer)."""
    p = Preflight(spec)
    model_dir = _model_dir(spec)
    if model_dir is not None and model_dir.is_dir():
        p.model = read_model_facts(model_dir)
        p.tokenizer = _tokenizer(model_dir)
    p.prompt_tokens = _prompt_tokens(spec, p.tokenizer)
    t = spec.transcoders
    tc_dir = existing_dictionary_folder(t)
    if t is not None and tc_dir is not None and tc_dir.is_dir():
        p.dictionary = read_declared(tc_dir)
        p.dictionary_where = f"transcoders.{t.source}"
        layers = set(p.dictionary.layers.values()) | {lyr for _, lyr in p.dictionary.hook_layers.values()}
        # only a per-layer folder layout says which layers it holds (a CLT has every layer)
        p.dictionary_layers = layers if p.dictionary.layers else None
    return p


def preflight(spec: Spec, checks: Iterable[Callable[[Preflight], Problems]] | None = None) -> Problems:
    """Every problem :data:`PREFLIGHT_CHECKS` (or ``checks``) find in ``spec`` without the weights."""
    return preflight_report(spec, checks).problems


@dataclass(frozen=True)
class PreflightReport:
    """What ``validate`` says: ``problems`` (errors, ``(location, message)``), ``warnings`` (the spec
    runs, but likely not as meant: :func:`leading_space_warnings`) and ``unchecked`` (what only the run
    can check, :func:`run_time_notes`)."""

    problems: Problems
    warnings: list[str]
    unchecked: list[str]


def preflight_report(spec: Spec, checks: Iterable[Callable[[Preflight], Problems]] | None = None) -> PreflightReport:
    """:func:`preflight`'s problems, with the warnings and what is left to the run."""
    p = gather(spec)
    problems: Problems = []
    for check in PREFLIGHT_CHECKS if checks is None else checks:
        problems += check(p)
    return PreflightReport(problems, leading_space_warnings(p), run_time_notes(p))


# ---------------------------------------------------------------------------- the checks
def _unit_targets(spec: Spec) -> Iterable[tuple[str, Any, str]]:
    """``(location, params, kind)`` of the targets that name a layer."""
    for i, t in enumerate(spec.targets):
        if t.kind in ("feature", "neuron", "direction"):
            yield f"targets[{i}].{t.kind}", t.params, t.kind


@preflight_check
def layers_exist(p: Preflight) -> Problems:
    """Targets, ``graph.mlp`` / ``graph.attention`` keys and ``transcoders.layers`` name layers the
    model has; feature targets name layers the dictionary holds."""
    out: Problems = []
    spec = p.spec
    model = p.model
    n = model.n_layers if model is not None else None
    if model is not None and n is not None:
        last = model.layers_text()
        for loc, params, _ in _unit_targets(spec):
            if params.layer >= n:
                out.append((f"{loc}.layer", f"layer {params.layer} requested, {last}"))
        for key in ("mlp", "attention"):
            value = getattr(spec.graph, key)
            if isinstance(value, dict):
                bad = sorted(layer for layer in value if layer >= n)
                if bad:
                    out.append((f"graph.{key}", f"layer keys {bad} are beyond the last layer, {last}; use keys "
                                                f"0-{n - 1} (layers not named take the default)"))
        t = spec.transcoders
        if t is not None and t.layers:
            bad = sorted(layer for layer in t.layers if layer >= n)
            if bad:
                out.append(("transcoders.layers", f"layers {bad} are beyond the last layer, {last}"))
        for i, item in enumerate([*spec.queries, *spec.validate]):
            where = f"queries[{i}]" if i < len(spec.queries) else f"validate[{i - len(spec.queries)}]"
            if item.kind == "qk" and item.params.layer >= n:
                out.append((f"{where}.qk.layer", f"layer {item.params.layer} requested, {last}"))
    if p.dictionary_layers is not None:
        for loc, params, kind in _unit_targets(spec):
            if kind == "feature" and params.layer not in p.dictionary_layers and (n is None or params.layer < n):
                out.append((f"{loc}.layer", f"layer {params.layer} has no transcoder; the dictionary folder has "
                                            f"layers {sorted(p.dictionary_layers)}"))
    return out


def _positions(spec: Spec) -> Iterable[tuple[str, int]]:
    for i, t in enumerate(spec.targets):
        if isinstance(t, (LogitTarget, LogitDiffTarget, TopLogitsTarget)):
            yield f"targets[{i}].position", t.position
        else:  # a feature, neuron or direction target: its location's position
            yield f"targets[{i}].{t.kind}.position", t.params.position
    for i, q in enumerate(spec.queries):
        if q.kind == "logit_lens":
            yield f"queries[{i}].logit_lens.position", q.params.position
    for where, items in (("queries", spec.queries), ("validate", spec.validate)):
        for i, q in enumerate(items):
            if q.kind == "qk":
                yield f"{where}[{i}].qk.query_position", q.params.query_position
                if isinstance(q.params.key_position, int):
                    yield f"{where}[{i}].qk.key_position", q.params.key_position
    for i, c in enumerate(spec.validate):
        if c.kind == "ablate" and c.params.positions:
            for j, pos in enumerate(c.params.positions):
                yield f"validate[{i}].ablate.positions[{j}]", pos


@preflight_check
def prompt_fits(p: Preflight) -> Problems:
    """The prompt fits the model's context and vocabulary; every position is inside the prompt."""
    out: Problems = []
    tokens = p.prompt_tokens
    if tokens is None:
        return out
    T = len(tokens)
    if p.model is not None and p.model.n_ctx is not None and T > p.model.n_ctx:
        out.append(("prompt", f"the prompt has {T} tokens, more than the model's context of {p.model.n_ctx} "
                              f"({p.model.file.name}); shorten it"))
    if p.model is not None and p.model.d_vocab is not None:
        bad = [t for t in tokens if t >= p.model.d_vocab]
        if bad:
            out.append(("prompt", f"token ids {bad[:5]} are outside the vocabulary (0..{p.model.d_vocab - 1})"))
    for loc, pos in _positions(p.spec):
        if not -T <= pos < T:
            out.append((loc, f"position {pos} is beyond the prompt of {T} tokens (valid: 0..{T - 1} or "
                             f"-{T}..-1)"))
    return out


def _tokens(spec: Spec) -> Iterable[tuple[str, Any]]:
    """``(location, token)`` of every token the spec names."""
    for i, t in enumerate(spec.targets):
        if isinstance(t, LogitTarget):
            yield f"targets[{i}].logit", t.logit
        elif isinstance(t, LogitDiffTarget):
            for j, x in enumerate(t.logit_diff):
                yield f"targets[{i}].logit_diff[{j}]", x
    for i, q in enumerate(spec.queries):
        if q.kind in ("logit_lens", "congruence"):
            for j, x in enumerate(q.params.tokens or ()):
                yield f"queries[{i}].{q.kind}.tokens[{j}]", x
    for i, c in enumerate(spec.validate):
        if c.kind == "patching" and c.params.metric is not None:
            m = c.params.metric
            values = m.params if m.kind == "logit_diff" else (m.params,)
            for j, x in enumerate(values):
                yield f"validate[{i}].patching.metric.{m.kind}" + (f"[{j}]" if m.kind == "logit_diff" else ""), x


@preflight_check
def tokens_exist(p: Preflight) -> Problems:
    """Every token string the spec names is one token of the tokenizer; every token id is in the
    vocabulary."""
    out: Problems = []
    vocab = p.model.d_vocab if p.model is not None else None
    for loc, token in _tokens(p.spec):
        if isinstance(token, int):
            if vocab is not None and token >= vocab:
                out.append((loc, f"token id {token} is outside the vocabulary (0..{vocab - 1})"))
            continue
        if p.tokenizer is None:
            continue
        try:
            tid = p.tokenizer.single_token(token, where=loc)
        except CircuitGraphError as exc:
            out.append(("", str(exc)))
            continue
        if vocab is not None and tid >= vocab:
            out.append((loc, f"token {token!r} has id {tid}, outside the model's vocabulary (0..{vocab - 1})"))
    return out


@preflight_check
def files_exist(p: Preflight) -> Problems:
    """Label files and direction files exist."""
    out: Problems = []
    labels = p.spec.export.diagram.labels if p.spec.export.diagram is not None else None
    if labels is not None and not Path(labels).is_file():
        out.append(("export.diagram.labels", f"label file not found: {labels}"))
    return out


@preflight_check
def dictionary_fits(p: Preflight) -> Problems:
    """The dictionary's config files name the spec's model (unless ``allow_model_mismatch``) and
    its input widths and hook layers fit the model's config."""
    t = p.spec.transcoders
    if p.dictionary is None or t is None or (p.model is None and not model_source(p.spec.model).named_without_config):
        return []
    problems, _ = fit_problems(
        p.dictionary, p.spec.model, config_name=p.model.model_name if p.model else None,
        d_model=p.model.d_model if p.model else None, n_layers=p.model.n_layers if p.model else None,
        allow_model_mismatch=t.allow_model_mismatch, where="")
    return [(p.dictionary_where, msg) for msg in problems]


# ---------------------------------------------------------------------------- unit indices
_UNIT_NAMES = {"feature": "features", "neuron": "neurons", "attention_head": "heads"}


def _unit_size(p: Preflight, kind: str, layer: int) -> tuple[int, str] | None:
    """``(units in layer, the file and key that say so)``, or None when the files do not say."""
    if kind == "feature":
        if p.dictionary is None or layer not in p.dictionary.widths:
            return None
        width, rel = p.dictionary.widths[layer]
        return width, rel
    if p.model is None:
        return None
    size = p.model.n_heads if kind == "attention_head" else p.model.n_neurons
    if size is None:
        return None
    return size, f"{p.model.file.name} {p.model.sources.get(kind, '')}".rstrip()


def _unit_problem(p: Preflight, ref: UnitReference) -> str | None:
    model = p.model
    n = model.n_layers if model is not None else None
    if ref.layers is not None:
        lo, hi = ref.layers
    elif n is not None:
        lo, hi = 0, n - 1
    else:
        return None  # every layer, and the number of layers is unknown
    if model is not None and n is not None and lo == hi and lo >= n:
        # targets' and qk's layers are reported by layers_exist
        elsewhere = ref.where.startswith("targets[") or ".qk." in ref.where
        return None if elsewhere else f"layer {lo} requested, {model.layers_text()}"
    sizes = [(layer, _unit_size(p, ref.kind, layer)) for layer in range(max(lo, 0), (hi if n is None else
                                                                                      min(hi, n - 1)) + 1)]
    known = [(layer, s) for layer, s in sizes if s is not None]
    if not known or len(known) != len(sizes):
        return None  # a layer whose size is unknown: the run checks it
    if all(ref.index < s[0] for _, s in known):
        return None
    name = _UNIT_NAMES[ref.kind]
    if lo == hi:
        size, source = known[0][1]
        return (f"{ref.kind} {ref.index} requested, layer {lo} has {size} {name} (0-{size - 1}; {source}); "
                f"use an index below {size}")
    if any(ref.index < s[0] for _, s in known):
        return None  # some layers of the range have it
    size = max(s[0] for _, s in known)
    return (f"{ref.kind} {ref.index} requested, layers {lo}-{hi} have at most {size} {name} (0-{size - 1}); "
            f"use an index below {size}")


@preflight_check
def units_exist(p: Preflight) -> Problems:
    """Every feature, neuron and head index the spec names (targets, node ids, node filters with a
    kind, ``qk`` and ``de_embedding`` heads, steering) is below the size that the model's
    ``config.json`` (heads: ``num_attention_heads``; neurons: ``intermediate_size``...) or the
    dictionary's config files (``d_sae``, a CLT's encoder rows) give its layer."""
    out: Problems = []
    for ref in unit_references(p.spec):
        message = _unit_problem(p, ref)
        if message is not None:
            out.append((ref.where, message))
    return out


# ---------------------------------------------------------------------------- same-length prompts
def _dataset_rows(spec: Spec) -> list[Any]:
    """The parsed rows of a dataset spec (those that parse: ``check_inputs`` reports the others)."""
    if spec.dataset is None:
        return []
    raw = list(spec.dataset) if isinstance(spec.dataset, tuple) else read_dataset_rows(Path(spec.dataset))[0]
    return parse_rows(raw)[0]


def _paired_prompts(spec: Spec) -> Iterable[tuple[str, Any, str, Any]]:
    """``(location, prompt, what it must line up with, that prompt)`` of every prompt that is
    patched position by position into another: a patching check's ``corrupted`` (or a dataset row's,
    when the check gives none), an ``ablate`` ``patch_prompt``."""
    if any(c.kind == "patching" and c.params.corrupted is None for c in spec.validate):
        for row in _dataset_rows(spec):
            if row.corrupted is not None:
                yield f"dataset row {row.number} ({row.id}).corrupted", row.corrupted, "its prompt", row.prompt
    for i, c in enumerate(spec.validate):
        if c.kind == "patching" and c.params.corrupted is not None:
            clean = c.params.clean if c.params.clean is not None else spec.prompt
            what = "the clean prompt" if c.params.clean is not None else "the prompt"
            yield f"validate[{i}].patching.corrupted", c.params.corrupted, what, clean
        elif c.kind == "ablate" and c.params.patch_prompt is not None:
            yield f"validate[{i}].ablate.patch_prompt", c.params.patch_prompt, "the prompt", spec.prompt


def _first_difference(tok: Any, a: list[int], b: list[int]) -> str:
    at = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))

    def piece(ids: list[int]) -> str:
        return repr(tok.token_str(ids[at])) if tok is not None and at < len(ids) else "(end)"

    return f"the first difference is token {at}: {piece(a)} vs {piece(b)}"


@preflight_check
def patched_prompts_line_up(p: Preflight) -> Problems:
    """A patching ``corrupted`` prompt (and an ``ablate`` ``patch_prompt``) has as many tokens as the
    prompt it is patched with: activations are copied position by position."""
    out: Problems = []
    for where, prompt, what, other in _paired_prompts(p.spec):
        a, b = tokens_of(prompt, p.tokenizer), tokens_of(other, p.tokenizer)
        if a is None or b is None or len(a) == len(b):
            continue
        name = "the corrupted prompt" if where.endswith(".corrupted") else "patch_prompt"
        out.append((where, f"{name} has {len(a)} tokens and {what} {len(b)} ({_first_difference(p.tokenizer, a, b)}); "
                           "activations are patched position by position, so both need the same token length: "
                           "change words that split into several tokens, or give token ids"))
    return out


# ---------------------------------------------------------------------------- targets without their space
def _target_strings(spec: Spec) -> Iterable[tuple[str, str]]:
    for loc, token in _tokens(spec):
        if isinstance(token, str) and (loc.startswith("targets[") or ".metric." in loc):
            yield loc, token


def leading_space_warnings(p: Preflight) -> list[str]:
    """A target token string without a leading space that is one token while its space-prefixed
    form is another single token (``"Mary"`` where the prompt asks for ``" Mary"``), each naming
    both tokens (:meth:`~circuitgraph.adapters.tokenizer.Tokenizer.space_variant`).  Skipped when the
    prompt text ends in whitespace (then the token without a space is the one that follows)."""
    if p.tokenizer is None:
        return []
    text = getattr(p.spec.prompt, "text", None)
    if isinstance(text, str) and text[-1:].isspace():
        return []
    out = []
    for loc, token in _target_strings(p.spec):
        message = p.tokenizer.space_warning(token, where=loc)
        if message is not None:
            out.append(message)
    return out


# ---------------------------------------------------------------------------- what only the run knows
def run_time_notes(p: Preflight) -> list[str]:
    """What ``validate`` could not check here, each as one line for ``checked at run time: ...``."""
    spec, out = p.spec, list(p.unchecked)
    m = spec.model
    if p.model is None:
        out.append(f"the model's layers, heads, neurons and vocabulary ({model_source(m).unread_config})")
    elif p.model.n_neurons is None or p.model.n_heads is None:
        missing = [k for k, v in (("heads", p.model.n_heads), ("neurons", p.model.n_neurons)) if v is None]
        if any(r.kind in ("attention_head", "neuron") for r in unit_references(spec)):
            out.append(f"head and neuron indices ({p.model.file.name} does not give the {' or '.join(missing)})")
    if spec.prompt is not None and p.prompt_tokens is None:
        out.append("the prompt's length, positions and token strings (no tokenizer files were read)")
    elif p.tokenizer is None and any(isinstance(t, str) for _, t in _tokens(spec)):
        out.append("token strings (no tokenizer files were read)")
    if spec.transcoders is not None:
        refs = [r for r in unit_references(spec) if r.kind == "feature"]
        known = p.dictionary.widths if p.dictionary is not None else {}
        if refs and not all(r.layers is not None and all(layer in known for layer in range(r.layers[0],
                                                                                         r.layers[1] + 1))
                            for r in refs):
            out.append("feature indices (the dictionary's config files do not give every layer's width)")
    if spec.dataset is not None:
        out.append("each dataset row's prompt against the model's context and vocabulary, and a row's own targets "
                   "(checked with the model loaded, before any row runs)")
    filters = [c for c in spec.validate if c.kind == "ablate"] + [s for s in spec.steer]
    if filters or any(q.kind in ("top_paths", "subgraph", "supernodes", "neighbours", "head_split")
                      for q in spec.queries):
        out.append("which graph nodes the node filters and node ids match (the graph is built first)")
    return out


@preflight_check
def features_fit(p: Preflight) -> Problems:
    """A ``features:`` section's units exist: its layers are the model's (and, for transcoder
    features, the dictionary's), a neuron run's model has dense MLPs, ``from_graph`` exists."""
    f = p.spec.features
    if f is None:
        return []
    out: Problems = []
    model = p.model
    n = model.n_layers if model is not None else None
    layers = [] if f.layers == "all" else list(f.layers)
    if model is not None and n is not None:
        bad = [layer for layer in layers if layer >= n]
        if bad:
            out.append(("features.layers", f"layers {bad} requested, {model.layers_text()}"))
    if f.units == "features" and p.dictionary_layers is not None:
        bad = [layer for layer in layers if layer not in p.dictionary_layers and (n is None or layer < n)]
        if bad:
            out.append(("features.layers", f"layers {bad} have no transcoder; the dictionary folder has layers "
                                           f"{sorted(p.dictionary_layers)} (or give units: neurons / heads)"))
    if f.units == "neurons" and p.model is not None:
        raw = p.model.raw
        experts = next((raw[k] for k in ("num_local_experts", "num_experts", "n_routed_experts")
                        if isinstance(raw.get(k), int) and raw[k] > 0), None)
        if experts:
            out.append(("features.units", f"units: neurons: the model routes its MLP through {experts} experts "
                                          f"({p.model.file.name}); neuron dashboards read dense MLPs: give units: "
                                          "heads, or units: features with transcoders"))
        if raw.get("attn_only") is True:
            out.append(("features.units", f"units: neurons: the model has no MLP layers ({p.model.file.name}, "
                                          "attn_only); give units: heads"))
    if f.features != "all" and not Path(f.features.from_graph).is_file():
        out.append(("features.features.from_graph", f"graph file not found: {f.features.from_graph}; give a graph "
                                                    f"written by circuitgraph (.json or .npz) with "
                                                    f"{f.node_kind} nodes"))
    return out
