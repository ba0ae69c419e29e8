"""GGUF checkpoints (llama.cpp's format): read, dequantise once to float32, cache as a Hugging Face folder.

``model: {path: FILE.gguf}`` loads a GGUF file of any family both transformers's GGUF loader and
circuitgraph (:data:`~circuitgraph.adapters.hf_config.FAMILIES`) support.  The file is converted
once: transformers dequantises every tensor to float32 (``from_pretrained(dir, gguf_file=...)``,
which needs the ``gguf`` and ``accelerate`` packages), and the result is saved with its
tokenizer (read from the GGUF too) as an ordinary Hugging Face folder in the cache
(:func:`models_dir`, ``gguf/<stem>-<key>``, the key made of the file's path, size and
modification time), so later runs load the folder in seconds.  The folder holds
:data:`RECORD_FILE`, which names the quantisation type (``Q4_1``...) and the count of tensors of
each type; the loader puts it in the graph's ``metadata.model.quantisation``.

The weights are the dequantised values of the quantised tensors, not the published model's
weights: a Q4_1 block stores 32 weights as 4-bit integers with one scale and one minimum, so
each weight differs from the original by up to half a quantisation step.  The graph is exact for
the dequantised model.

This module imports neither torch nor transformers at import time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from circuitgraph._io import read_json_file
from circuitgraph.adapters.hf_config import FAMILIES, unsupported_model_type_message
from circuitgraph.errors import LoadError, one_line

__all__ = ["GGUFSummary", "RECORD_FILE", "models_dir", "is_gguf_file", "read_gguf_summary", "convert_gguf",
           "gguf_folder", "gguf_cache_folder", "read_record", "MODELS_DIR_ENV", "GGUF_PACKAGES_HINT"]

#: the environment variable naming circuitgraph's model cache (default ``~/.cache/circuitgraph/models``)
MODELS_DIR_ENV = "CIRCUITGRAPH_MODELS_DIR"
#: the file a converted folder records its origin in (JSON)
RECORD_FILE = "circuitgraph-model.json"
#: bump when the conversion changes, so that cached folders are converted again
CONVERSION_VERSION = 1
GGUF_PACKAGES_HINT = "pip install 'circuitgraph-lm[gguf]' (the gguf and accelerate packages)"
_MAGIC = b"GGUF"


def models_dir() -> Path:
    """circuitgraph's model cache: ``$CIRCUITGRAPH_MODELS_DIR``, else ``~/.cache/circuitgraph/models``."""
    given = os.environ.get(MODELS_DIR_ENV)
    return Path(given).expanduser() if given else Path.home() / ".cache" / "circuitgraph" / "models"


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a GGUF file (by its suffix; the contents are checked when read)."""
    return Path(path).suffix.lower() == ".gguf" and not Path(path).is_dir()


@dataclass(frozen=True)
class GGUFSummary:
    """What a GGUF file's header says: its architecture, quantisation and size."""

    file: str
    architecture: str
    #: the file's quantisation type (``general.file_type`` without llama.cpp's MOSTLY_/ALL_ prefix: Q4_1,
    #: Q8_0, F16...), else the most common type of its matrices
    file_type: str
    #: tensor type -> how many tensors have it
    tensor_types: dict[str, int]
    n_params: int
    #: ``<architecture>.block_count`` and ``.embedding_length`` (0 where the header lacks them)
    n_layers: int = 0
    d_model: int = 0

    def record(self) -> dict[str, Any]:
        """``metadata.model.quantisation``: what the graph records about the checkpoint."""
        return {"format": "gguf", "file": self.file, "file_type": self.file_type,
                "tensor_types": dict(self.tensor_types), "dequantised_to": "float32"}

    def warning(self) -> str:
        return warning_text(self.record())


def warning_text(record: dict[str, Any]) -> str:
    """The one warning line of a model dequantised from ``record`` (a :meth:`GGUFSummary.record`)."""
    return (f"{record.get('file')}: {record.get('file_type')} weights dequantised to float32: an approximation of "
            "the published model, not its released weights (metadata.model.quantisation records it)")


def _require_gguf(what: str) -> Any:
    missing = [p for p in ("gguf", "accelerate") if importlib.util.find_spec(p) is None]
    if missing:
        raise LoadError(f"{what} needs the {' and '.join(missing)} package{'s' if len(missing) > 1 else ''}, "
                        f"which {'are' if len(missing) > 1 else 'is'} not installed; {GGUF_PACKAGES_HINT}")
    import gguf

    return gguf


def read_gguf_summary(path: str | os.PathLike[str]) -> GGUFSummary:
    """The header of the GGUF file ``path`` (no tensor is read); a file that is not GGUF, or is
    truncated, is a one-line :class:`LoadError`."""
    path = Path(path)
    if not path.is_file():
        raise LoadError(f"GGUF file {path} does not exist")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != _MAGIC:
        raise LoadError(f"{path} is not a GGUF file (it starts with {magic!r}, a GGUF file with {_MAGIC!r}); "
                        "give a llama.cpp .gguf checkpoint or a model folder")
    gguf = _require_gguf(f"reading the GGUF file {path.name}")
    try:
        reader = gguf.GGUFReader(str(path), "r")
        fields = reader.fields
        arch = fields["general.architecture"].contents() if "general.architecture" in fields else None
        types = Counter(t.tensor_type.name for t in reader.tensors)
        n_params = sum(int(t.n_elements) for t in reader.tensors)
        file_type = None
        if "general.file_type" in fields:
            try:
                file_type = gguf.LlamaFileType(int(fields["general.file_type"].contents())).name
            except ValueError:
                file_type = None
        if file_type is None:  # the most common type of the matrices
            mats = Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) > 1)
            file_type = (mats or types).most_common(1)[0][0] if (mats or types) else "unknown"
    except Exception as exc:  # noqa: BLE001 - the gguf package raises many types on a broken file
        raise LoadError(f"{path} is not a readable GGUF file ({one_line(exc, limit=200)}); the file may be truncated "
                        "or corrupt: download it again") from None
    for prefix in ("MOSTLY_", "ALL_"):
        file_type = file_type.removeprefix(prefix)
    if not isinstance(arch, str) or not arch:
        raise LoadError(f"{path}: the GGUF header names no general.architecture; the file is not a model checkpoint")
    size = {}
    for key in ("block_count", "embedding_length"):
        field = fields.get(f"{arch}.{key}")
        try:
            size[key] = int(field.contents()) if field is not None else 0
        except (TypeError, ValueError):
            size[key] = 0
    return GGUFSummary(path.name, arch, file_type, dict(sorted(types.items())), n_params,
                       size["block_count"], size["embedding_length"])


def _transformers_gguf_architectures() -> list[str]:
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:  # older transformers keep the table elsewhere
        from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

        return [a for a in GGUF_CONFIG_MAPPING if a not in ("general", "tokenizer")]
    return [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]


def convert_gguf(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> GGUFSummary:
    """Dequantise the GGUF file ``path`` to float32 and save it, with its tokenizer, as a Hugging
    Face folder ``out`` (which must not exist; written in full or not at all) holding
    :data:`RECORD_FILE`.  The architecture must be one transformers's GGUF loader reads and a
    family of :data:`~circuitgraph.adapters.hf_config.FAMILIES`; each is checked before the
    tensors are read."""
    path, out = Path(path), Path(out)
    summary = read_gguf_summary(path)
    known = _transformers_gguf_architectures()
    if summary.architecture not in known:
        raise LoadError(f"{path.name}: GGUF architecture {summary.architecture!r} is not one transformers's GGUF loader "
                        f"reads (it reads {', '.join(known)}); convert the checkpoint to a Hugging Face folder "
                        "another way and use model: {path: DIR}")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, where = str(path.parent), {"gguf_file": path.name, "local_files_only": True}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        with _quiet_transformers():
            try:
                config = AutoConfig.from_pretrained(folder, **where)
            except Exception as exc:  # noqa: BLE001 - transformers's own message, in one line
                raise LoadError(f"{path.name}: transformers cannot read its configuration "
                                f"({one_line(exc, limit=300)})") from None
            if config.model_type not in FAMILIES:
                raise LoadError(unsupported_model_type_message(
                    config.model_type, f"{path.name} (GGUF architecture {summary.architecture})"))
            try:
                model = AutoModelForCausalLM.from_pretrained(folder, **where, dtype=torch.float32)
                tokenizer = AutoTokenizer.from_pretrained(folder, **where)
            except Exception as exc:  # noqa: BLE001
                raise LoadError(f"{path.name}: transformers could not dequantise it ({one_line(exc, limit=300)}); "
                                "the file may be truncated or use a quantisation type transformers does not read"
                                ) from None
            # the dequantised model is an ordinary float32 model: drop the GGUF quantiser's flags so that
            # save_pretrained writes plain safetensors (no copy of the weights is made); transformers sets
            # these attributes at load, torch's Module.__setattr__ types only tensors and modules
            setattr(model, "hf_quantizer", None)  # noqa: B010
            for holder in (model.config, getattr(model, "generation_config", None)):
                if holder is not None and hasattr(holder, "quantization_config"):
                    delattr(holder, "quantization_config")
            if getattr(model, "is_quantized", False):
                setattr(model, "is_quantized", False)  # noqa: B010
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            del model
        write_record(tmp, {"gguf": summary.record(), "conversion_version": CONVERSION_VERSION})
        os.chmod(tmp, 0o755)  # mkdtemp's folder is private; the cache's folders are not
        _publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No progress bars or log lines from transformers while it converts (library code prints nothing;
    its GGUF reader calls tqdm directly)."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    bar, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    plain = getattr(gguf_utils, "tqdm", None)  # the module's own import of tqdm, patched in place
    if plain is not None:
        setattr(gguf_utils, "tqdm", functools.partial(plain, disable=True))  # noqa: B010
    try:
        yield
    finally:
        if plain is not None:
            setattr(gguf_utils, "tqdm", plain)  # noqa: B010
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


def _publish(tmp: Path, out: Path) -> None:
    """Move the finished folder ``tmp`` to ``out`` in one rename; another process that got there
    first wins (its folder is as good as ours)."""
    try:
        os.rename(tmp, out)
    except OSError:
        if not (out / RECORD_FILE).is_file():
            raise


def write_record(folder: Path, record: dict[str, Any]) -> None:
    (folder / RECORD_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_record(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A converted folder's :data:`RECORD_FILE` (None for any other folder)."""
    file = Path(folder) / RECORD_FILE
    if not file.is_file():
        return None
    try:
        value = read_json_file(file, "GGUF conversion record")
    except LoadError as exc:
        raise LoadError(f"{file} is not readable JSON ({one_line(exc, limit=200)}); delete the folder {folder} and "
                        "convert or fetch the model again") from None
    return value if isinstance(value, dict) else None


def gguf_cache_folder(path: str | os.PathLike[str], cache: str | os.PathLike[str] | None = None) -> Path:
    """Where the converted folder of the GGUF file ``path`` is kept (converted or not yet): in ``cache``
    (default ``models_dir()/gguf``), named by the file's stem and a key made of its resolved path,
    size and modification time, so that a file replaced in place is converted again."""
    path = Path(path)
    if not path.is_file():
        raise LoadError(f"GGUF file {path} does not exist")
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{CONVERSION_VERSION}".encode()).hexdigest()
    folder = Path(cache) if cache is not None else models_dir() / "gguf"
    return folder / f"{path.stem}-{key[:16]}"


def gguf_folder(path: str | os.PathLike[str], cache: str | os.PathLike[str] | None = None) -> Path:
    """The Hugging Face folder of the GGUF file ``path`` (:func:`gguf_cache_folder`), converted on
    first use (:func:`convert_gguf`)."""
    out = gguf_cache_folder(path, cache)
    if not (out / RECORD_FILE).is_file():
        if out.exists():  # a folder without its record is not ours to trust: convert again
            shutil.rmtree(out)
        convert_gguf(path, out)
    return out
