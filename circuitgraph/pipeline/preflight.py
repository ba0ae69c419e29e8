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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from circuitgraph._io import read_json_file
from circuitgraph.adapters.dictionary_fit import DeclaredDictionary, fit_problems, read_declared
from circuitgraph.adapters.files import existing_model_folder
from circuitgraph.adapters.tokenizer import Tokenizer, resolve_tokenizer_dir
from circuitgraph.builtin import BUILTIN_DICTIONARIES, builtin_dictionary_dir
from circuitgraph.errors import CircuitGraphError
from circuitgraph.spec import Spec

__all__ = ["ModelFacts", "Preflight", "PREFLIGHT_CHECKS", "preflight_check", "preflight", "read_model_facts"]

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

    def layers_text(self) -> str:
        return f"the model has {self.n_layers} layers (0-{self.n_layers - 1}; {self.file.name})"


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
        return ModelFacts(file, "transformer_lens", _first_int(raw, "n_layers"), _first_int(raw, "n_ctx"),
                          _first_int(raw, "d_vocab"), _first_int(raw, "d_model"),
                          raw.get("model_name") if isinstance(raw.get("model_name"), str) else None,
                          None, raw)
    cfg = raw
    if isinstance(raw.get("text_config"), dict):  # multimodal configs nest the language model's
        cfg = {**raw["text_config"], **{k: v for k, v in raw.items() if k != "text_config" and k not in
                                       raw["text_config"]}}
    name = raw.get("_name_or_path")
    return ModelFacts(
        file, "hf",
        _first_int(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers"),
        _first_int(cfg, "max_position_embeddings", "n_positions", "n_ctx", "seq_length"),
        _first_int(cfg, "vocab_size"),
        _first_int(cfg, "hidden_size", "n_embd", "d_model"),
        Path(name).name if isinstance(name, str) and name else None,
        raw.get("model_type") if isinstance(raw.get("model_type"), str) else None,
        raw,
    )


@dataclass
class Preflight:
    """What the checks read: the spec and what its files say (``None`` where they cannot say)."""

    spec: Spec
    model: ModelFacts | None = None
    dictionary: DeclaredDictionary | None = None
    dictionary_where: str = "transcoders"
    tokenizer: Any = None
    #: the main prompt's token ids (``None``: a dataset, or no tokenizer for a text prompt)
    prompt_tokens: list[int] | None = None
    #: the layers the dictionary folder holds (``None``: unknown)
    dictionary_layers: set[int] | None = None


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


def _dictionary_dir(spec: Spec) -> Path | None:
    t = spec.transcoders
    if t is None:
        return None
    if t.source == "path":
        return Path(t.path)
    if t.source == "builtin":
        return builtin_dictionary_dir(t.builtin) if t.builtin in BUILTIN_DICTIONARIES else None
    return None


def _tokenizer(model_dir: Path) -> Any:
    try:
        tok_dir = resolve_tokenizer_dir(model_dir / "tokenizer")
        if tok_dir is None and (model_dir / "tokenizer.json").is_file():  # a save_pretrained folder
            tok_dir = model_dir
        return Tokenizer.from_dir(tok_dir) if tok_dir is not None else None
    except CircuitGraphError:
        return None  # check_input_files reports a broken tokenizer


def _prompt_tokens(spec: Spec, tokenizer: Any) -> list[int] | None:
    prompt = spec.prompt
    if prompt is None:
        return None
    tokens = getattr(prompt, "tokens", None)
    if tokens is not None:
        return list(tokens)
    if tokenizer is None:
        return None
    ids = tokenizer.encode(prompt.text)
    if prompt.prepend_bos and tokenizer.bos_id is not None:
        ids = [tokenizer.bos_id] + ids
    return ids


def gather(spec: Spec) -> Preflight:
    """Read what :class:`Preflight` holds for ``spec`` (nothing heavy: config files and the tokenizer)."""
    p = Preflight(spec)
    model_dir = _model_dir(spec)
    if model_dir is not None and model_dir.is_dir():
        p.model = read_model_facts(model_dir)
        p.tokenizer = _tokenizer(model_dir)
    p.prompt_tokens = _prompt_tokens(spec, p.tokenizer)
    tc_dir = _dictionary_dir(spec)
    if tc_dir is not None and tc_dir.is_dir():
        p.dictionary = read_declared(tc_dir)
        p.dictionary_where = f"transcoders.{spec.transcoders.source}"
        layers = set(p.dictionary.layers.values()) | {lyr for _, lyr in p.dictionary.hook_layers.values()}
        # only a per-layer folder layout says which layers it holds (a CLT has every layer)
        p.dictionary_layers = layers if p.dictionary.layers else None
    return p


def preflight(spec: Spec, checks: Iterable[Callable[[Preflight], Problems]] | None = None) -> Problems:
    """Every problem :data:`PREFLIGHT_CHECKS` (or ``checks``) find in ``spec`` without the weights."""
    p = gather(spec)
    problems: Problems = []
    for check in PREFLIGHT_CHECKS if checks is None else checks:
        problems += check(p)
    return problems


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
    n = p.model.n_layers if p.model is not None else None
    if n is not None:
        last = p.model.layers_text()
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
        if t.kind in ("feature", "neuron", "direction"):
            yield f"targets[{i}].{t.kind}.position", t.params.position
        elif hasattr(t, "position"):
            yield f"targets[{i}].position", t.position
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
        if t.kind == "logit":
            yield f"targets[{i}].logit", t.logit
        elif t.kind == "logit_diff":
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
    if p.dictionary is None or (p.model is None and p.spec.model.source == "path"):
        return []
    problems, _ = fit_problems(
        p.dictionary, p.spec.model, config_name=p.model.model_name if p.model else None,
        d_model=p.model.d_model if p.model else None, n_layers=p.model.n_layers if p.model else None,
        allow_model_mismatch=p.spec.transcoders.allow_model_mismatch, where="")
    return [(p.dictionary_where, msg) for msg in problems]
