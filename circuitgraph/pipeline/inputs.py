"""From spec to live inputs: the model adapter, transcoders, prompt tokens and targets.

Every check on user input that needs the model (token ids in the vocabulary, layers and
positions in range, prompt length against n_ctx) happens here, before anything is written.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitgraph.adapters.architecture import ModelAdapter
from circuitgraph.adapters.dictionary_fit import fit_problems, read_declared
from circuitgraph.adapters.files import existing_dictionary_folder, read_direction_file
from circuitgraph.adapters.loading import (
    folder_backend,
    load_model_spec,
    torch_dtype,
)
from circuitgraph.adapters.tokenizer import check_prompt_text, prompt_fields, prompt_ids
from circuitgraph.attribution.targets import ResolvedTarget, normalise_position, resolve_token, top_logit_targets
from circuitgraph.builtin import BUILTIN_MODELS
from circuitgraph.dictionaries import Dictionary
from circuitgraph.dictionaries.hub import resolve_hf_dictionary
from circuitgraph.dictionaries.sources import load_dictionary_spec
from circuitgraph.errors import AttributionError, LeadingSpaceWarning, LoadError, ShapeMismatchError, TokenError
from circuitgraph.spec import Spec
from circuitgraph.spec.kinds import ACTIVATION_KINDS
from circuitgraph.spec.load import trained_dictionary_hint

if TYPE_CHECKING:
    from circuitgraph.adapters.tokenizer import Tokenizer

__all__ = ["LoadedInputs", "needs_transformer_lens", "load_inputs", "check_dictionary_model", "resolve_prompt", "resolve_targets",
           "resolve_prompt_like"]

#: what :func:`load_inputs` loads for a spec: the model adapter and its dictionaries (None without
#: ``transcoders:``); a dataset or features worker loads them once and hands them to every prompt
LoadedInputs = tuple[ModelAdapter, Dictionary | None]


def needs_transformer_lens(spec: Spec) -> bool:
    """Whether loading ``spec``'s model imports transformer_lens: models by name, Hugging Face folders,
    ``backend: transformer_lens`` and TransformerLens folders outside the native whitelist do
    (:func:`circuitgraph.adapters.loading.folder_backend`)."""
    m = getattr(spec, "model", None)
    if m is None or m.source in ("name", "pretrained") or m.backend == "transformer_lens":
        return True
    path = m.path if m.source == "path" else BUILTIN_MODELS[m.builtin]() / "model"
    return folder_backend(path, m.backend, trust_remote_code=m.trust_remote_code) != "native"


def load_inputs(spec: Spec) -> LoadedInputs:
    """Load the model and transcoders a spec names, in the dtype the graph needs."""
    m = spec.model
    t = spec.transcoders
    if t is not None and t.source == "path" and not t.path.is_dir():  # before the model is loaded
        raise LoadError(f"transcoder folder not found: {t.path}{trained_dictionary_hint(t.path)}")
    compute = torch_dtype(spec.graph.dtype)
    weights = torch_dtype(m.dtype)
    # float64 accumulation runs the whole forward in float64 so measured values are exact too
    load_dtype = "float64" if compute == torch.float64 else m.dtype
    adapter = load_model_spec(m, dtype=load_dtype, weights_dtype=str(weights).replace("torch.", ""))
    tcs = None
    t = spec.transcoders
    tc_dtype = torch.float64 if compute == torch.float64 else torch.float32
    mismatch = None
    folder = existing_dictionary_folder(t)
    if folder is not None:  # before any weight is read
        mismatch = check_dictionary_model(spec, folder, adapter)
    if t is not None:
        tcs = load_dictionary_spec(t, adapter, dtype=tc_dtype)
        if t.source == "hf":  # its folder is known once the cache has it
            mismatch = check_dictionary_model(spec, resolve_hf_dictionary(t.hf)[0], adapter)
        if mismatch is not None and isinstance(tcs.source, dict):
            tcs.source = {**tcs.source, "model_mismatch": mismatch}
    return adapter, tcs


def check_dictionary_model(spec: Spec, folder: Path, adapter: ModelAdapter) -> str | None:
    """The dictionary in ``folder`` fits the spec's model (see :mod:`circuitgraph.adapters.dictionary_fit`):
    a dictionary whose files name another model, or whose input width or hook layers do not fit, is
    a one-line :class:`~circuitgraph.errors.LoadError` naming both.  With
    ``transcoders.allow_model_mismatch`` a name that differs is accepted and returned (the graph's
    metadata records it); shapes are never overridden."""
    t = spec.transcoders
    shown = f"{folder.parent.name}/{folder.name}" if t.source == "path" else getattr(t, t.source)
    problems, note = fit_problems(
        read_declared(folder), spec.model, config_name=getattr(adapter.model.cfg, "model_name", None),
        d_model=adapter.facts.d_model, n_layers=adapter.facts.n_layers,
        allow_model_mismatch=t.allow_model_mismatch, where=f"transcoders.{t.source} {shown!r}")
    if problems:
        shape = any("d_in=" in p or "layers (0-" in p for p in problems)
        raise (ShapeMismatchError if shape else LoadError)("; ".join(problems))
    return note


def check_layer_keys(spec: Spec, n_layers: int) -> None:
    """Every per-layer setting names layers the model has (a key out of range is an error,
    never silently ignored)."""
    problems = []
    last = f"the model has {n_layers} layers (0-{n_layers - 1})"
    for key in ("mlp", "attention"):
        value = getattr(spec.graph, key)
        if isinstance(value, dict):
            bad = sorted(layer for layer in value if not 0 <= layer < n_layers)
            if bad:
                problems.append(f"graph.{key}: layer keys {bad} are out of range, {last}; "
                                f"use keys 0-{n_layers - 1} (layers not named take the default)")
    t = spec.transcoders
    if t is not None:
        for key, layers in (("layers", t.layers), ("ids", list(t.ids or {}) if t.source == "release" else None)):
            bad = sorted(int(layer) for layer in layers or () if not 0 <= int(layer) < n_layers)
            if bad:
                problems.append(f"transcoders.{key}: layers {bad} are out of range, {last}; "
                                f"use layers 0-{n_layers - 1}")
    if problems:
        raise AttributionError("; ".join(problems))


def resolve_prompt_like(prompt: Any, adapter: ModelAdapter, where: str = "prompt") -> list[int]:
    """A spec prompt (TextPrompt / TokensPrompt, or a plain str / list) -> checked token ids."""
    f = adapter.facts
    fields = prompt_fields(prompt)
    text = fields.text
    if text is not None:
        tok = adapter.tokenizer
        if tok is None:
            raise TokenError(f"{where}: a text prompt needs a tokenizer and this model has none; "
                             "give token ids as {tokens: [...]}")
        if not text.strip():
            raise TokenError(f"{where}: the prompt is empty; give some text")

        check_prompt_text(tok, text, strict=fields.strict, where=where)
        bos = fields.prepend_bos
        if bos and tok.bos_id is None:
            raise TokenError(f"{where}: prepend_bos is true but the tokenizer has no BOS token; "
                             "set prepend_bos: false")
        ids = prompt_ids(tok, text, bos)
    else:
        ids = list(fields.tokens if fields.tokens is not None else prompt)
    if not ids:
        raise TokenError(f"{where}: the prompt has no tokens")
    bad = [i for i in ids if not (0 <= int(i) < f.d_vocab)]
    if bad:
        raise TokenError(f"{where}: token ids {bad[:5]} are outside the vocabulary (0..{f.d_vocab - 1})")
    if len(ids) > f.n_ctx:
        raise TokenError(f"{where}: the prompt has {len(ids)} tokens, more than the model's context of "
                         f"{f.n_ctx}; shorten it")
    return [int(i) for i in ids]


def resolve_prompt(spec: Spec, adapter: ModelAdapter) -> list[int]:
    return resolve_prompt_like(spec.prompt, adapter)


def _direction_vector(d: Any, d_model: int, where: str) -> torch.Tensor:
    if d.vector is not None:
        v = torch.tensor(d.vector, dtype=torch.float64)
    else:
        v = torch.from_numpy(read_direction_file(d.file, where))
    if v.shape[0] != d_model:
        raise AttributionError(f"{where}: the direction has {v.shape[0]} numbers, the model's d_model is {d_model}")
    if not torch.isfinite(v).all():
        raise AttributionError(f"{where}: the direction holds NaN or inf")
    if not v.abs().max() > 0:
        raise AttributionError(f"{where}: the direction is all zeros, so the target is always 0; give a non-zero "
                               "direction")
    return v


def _warn_leading_space(spec: Spec, tokenizer: Tokenizer | None) -> None:
    """A :class:`~circuitgraph.errors.LeadingSpaceWarning` for each target string written without
    the leading space its single-token form after a word has (``"Mary"`` for ``" Mary"``), unless
    the prompt text ends in whitespace."""
    text = getattr(spec.prompt, "text", None)
    if tokenizer is None or (isinstance(text, str) and text[-1:].isspace()):
        return
    for i, t in enumerate(spec.targets):
        tokens = (t.logit,) if t.kind == "logit" else t.logit_diff if t.kind == "logit_diff" else ()
        for j, token in enumerate(tokens):
            if isinstance(token, str):
                where = f"targets[{i}].{t.kind}" + (f"[{j}]" if t.kind == "logit_diff" else "")
                message = tokenizer.space_warning(token, where=where)
                if message is not None:
                    warnings.warn(message, LeadingSpaceWarning, stacklevel=2)


def resolve_targets(spec: Spec, adapter: ModelAdapter, transcoders: Dictionary | None,
                    logits: torch.Tensor, n_pos: int) -> list[ResolvedTarget]:
    """Spec targets -> ResolvedTarget values (tokens resolved, positions and layers checked)."""
    f = adapter.facts
    tok = adapter.tokenizer
    out: list[ResolvedTarget] = []
    _warn_leading_space(spec, tok)
    for i, t in enumerate(spec.targets):
        where = f"targets[{i}].{t.kind}"
        weight = 1.0 if getattr(t, "weight", None) is None else float(t.weight)
        if t.kind == "logit":
            pos = normalise_position(t.position, n_pos, f"targets[{i}].position")
            v = resolve_token(t.logit, tok, f.d_vocab, where)
            out.append(ResolvedTarget("logit", pos, weight, (v,), t.relative_to_mean))
        elif t.kind == "logit_diff":
            pos = normalise_position(t.position, n_pos, f"targets[{i}].position")
            a, b = (resolve_token(x, tok, f.d_vocab, f"{where}[{j}]") for j, x in enumerate(t.logit_diff))
            out.append(ResolvedTarget("logit_diff", pos, weight, (a, b)))
        elif t.kind == "top_logits":
            pos = normalise_position(t.position, n_pos, f"targets[{i}].position")
            p = t.top_logits
            out += top_logit_targets(logits, position=pos, max_n=p.max_n,
                                     cumulative_probability=p.cumulative_probability,
                                     relative_to_mean=p.relative_to_mean)
        elif t.kind in ACTIVATION_KINDS:
            loc = getattr(t, t.kind)
            adapter.check_layer(loc.layer, what=f"{where}.layer")
            pos = normalise_position(loc.position, n_pos, f"{where}.position")
            if t.kind == "feature":
                if transcoders is None or loc.layer not in transcoders:
                    raise AttributionError(f"{where}: no transcoder is loaded for layer {loc.layer}")
                size = transcoders[loc.layer].d_sae
            else:
                size = f.n_neurons  # num_experts * d_mlp on mixture-of-experts layers
            if loc.index >= size:
                raise AttributionError(f"{where}.index: {t.kind} {loc.index} requested, layer {loc.layer} has "
                                       f"{size} {t.kind}s (0-{size - 1})")
            out.append(ResolvedTarget(t.kind, pos, weight, layer=loc.layer, index=loc.index))
        elif t.kind == "direction":
            d = t.direction
            adapter.check_layer(d.layer, what=f"{where}.layer")
            pos = normalise_position(d.position, n_pos, f"{where}.position")
            vec = _direction_vector(d, f.d_model, where)
            out.append(ResolvedTarget("direction", pos, weight, layer=d.layer, site=d.site, vector=vec,
                                      name=d.name or ""))
        else:  # the spec's union is closed
            raise AttributionError(f"{where}: unknown target kind")
    for i, r in enumerate(out):
        if r.kind == "logit_diff" and r.tokens[0] == r.tokens[1]:
            raise TokenError(
                f"targets[{i}].logit_diff: both tokens are id {r.tokens[0]}, so the target is always 0; give two "
                "different tokens"
            )
    return out
