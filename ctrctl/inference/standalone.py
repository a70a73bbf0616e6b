"""Load and run a ctrctl serving artifact with torch, fbgemm_gpu and safetensors alone.

This file is copied into every artifact as ``serving.py`` and must not import ctrctl: it
imports only torch, numpy, safetensors and the standard library (and fbgemm_gpu, which
registers the embedding kernel's op, when the program uses it). Raw columns become model
inputs in ``serving_encoder.py`` beside it (``standalone_encoder.py`` in the package),
loaded by file path, column by column. Raw rows of string features
in hash mode need the preprocess step's string hash, which is polars' ``hash(seed)``: for
them (and only them) polars is imported, and before its first use it must give the ids the
artifact recorded for a set of probe strings (the ids the training data's polars gave), so a
polars whose hash differs is a clear error rather than wrong scores. Loading checks the
manifest and the sha256 and size of every file before anything is read, so a tampered,
truncated or swapped file is an :class:`ArtifactError` naming it; tensors come from
safetensors and the program from ``torch.export`` with no weights and no example inputs in
it, so nothing is unpickled.

Folder::

    manifest.json            format, files (sha256, bytes), input contract, state layout
    program.pt2              torch.export program: (dense, ids, lengths) -> probabilities
    dense.safetensors        the dense layers' parameters
    tables/shard-00000.safetensors ...   one file of quantized tables per serving shard
    serving_plan.json        which shard holds which table
    serving.py               this loader
    serving_encoder.py       raw columns -> model inputs (loaded by the loader)
    serving_timestamps.py    timestamp columns -> derived features (loaded by the encoder)

Example:
    >>> import serving
    >>> model = serving.load("export")
    >>> model.predict_records([{"I1": "3", "C1": "68fd1e64", ...}])     # array([0.031, ...])
    >>> model.input_columns()                                           # ['I1', ..., 'C26']
    >>> model.score_columns({"I1": ["3", None], "C1": ["68fd1e64", ""]}, 2)
    >>> model.score(dense, ids, lengths)                                # (B,) tensor
    >>> fast = serving.load("export", compile=True)    # TorchInductor: needs a C++ compiler

``compile=True`` compiles the program for this machine with TorchInductor (part of torch;
on CPU it needs a C++ compiler) at load time, several seconds: the weights become
constants of the compiled code (``freezing``), so oneDNN's bfloat16 layers get prepacked
weights, and the interaction's concatenations, conversions and gathers are fused. Where
it cannot compile, the program runs as exported, with a warning. It scores as the program
does: bitwise for a bfloat16 dense part, within an ulp for an FP32 one, in the tests.
"""

import hashlib
import importlib.util
import json
import os
import warnings

import numpy as np
import torch
from safetensors.torch import load_file

FORMAT = "ctrctl.export"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


class ArtifactError(Exception):
    """A serving artifact that cannot be used: what is wrong, and in which file."""


class InputError(ArtifactError, ValueError):
    """Raw input the artifact's contract refuses: an unknown column, a value of the wrong
    type or form, a column whose length is not the row count.

    Attributes:
        feature: the column at fault (None: the request as a whole).
        row: the row index (None: the whole column).
        expected: what the contract expects there.
    """

    def __init__(self, message, feature=None, row=None, expected=""):
        super().__init__(message)
        self.feature, self.row, self.expected = feature, row, expected


#: The encoder beside this loader: ``serving_encoder.py`` in an artifact, the package's
#: ``standalone_encoder.py`` otherwise. Loaded by file path, never from ``sys.path``.
ENCODER_FILES = ("serving_encoder.py", "standalone_encoder.py")
_encoder = None


def encoder_module():
    """The encoder module beside this file (loaded once)."""
    global _encoder
    if _encoder is None:
        here = os.path.dirname(os.path.abspath(__file__))
        path = next((os.path.join(here, n) for n in ENCODER_FILES
                     if os.path.isfile(os.path.join(here, n))), None)
        if path is None:
            raise ArtifactError(f"{here}: no {ENCODER_FILES[0]} beside the loader")
        spec = importlib.util.spec_from_file_location("_ctrctl_serving_encoder", path)
        if spec is None or spec.loader is None:
            raise ArtifactError(f"{path}: cannot be loaded as a Python module")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _encoder = module
    return _encoder


def sha256_file(path, chunk=1 << 20):
    """The hex sha256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while True:
            block = handle.read(chunk)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()


def _join(folder, relative):
    return str(folder).rstrip("/") + "/" + relative


def verify(folder):
    """Read the manifest and check every file it lists (size, then sha256); return it."""
    where = _join(folder, MANIFEST)
    try:
        with open(where) as handle:
            manifest = json.load(handle)
    except FileNotFoundError:
        raise ArtifactError(f"{where}: no manifest: not a ctrctl serving artifact") from None
    except OSError as exc:  # a file where the folder should be, no permission
        raise ArtifactError(f"{where}: cannot read the manifest ({exc.strerror})") from None
    except ValueError as exc:  # not JSON, or not UTF-8
        raise ArtifactError(f"{where}: the manifest is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{where}: the manifest is not a JSON object")
    if manifest.get("format") != FORMAT:
        raise ArtifactError(f"{where}: format {manifest.get('format')!r} is not {FORMAT!r}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{where}: format version {manifest.get('format_version')} is "
                            f"not supported (this loader reads {FORMAT_VERSION})")
    for relative, entry in sorted(manifest.get("files", {}).items()):
        path = _join(folder, relative)
        try:
            with open(path, "rb") as handle:
                handle.seek(0, 2)
                size = handle.tell()
        except FileNotFoundError:
            raise ArtifactError(f"{path}: missing (the manifest lists it)") from None
        if size != entry["bytes"]:
            raise ArtifactError(f"{path}: {size} bytes where the manifest says "
                                f"{entry['bytes']}: the file is truncated or replaced")
        if sha256_file(path) != entry["sha256"]:
            raise ArtifactError(f"{path}: sha256 differs from the manifest's: the file was "
                                "modified or swapped with another")
    return manifest


class ServingModel:
    """A loaded artifact: :meth:`score` for model inputs, :meth:`predict_records` for raw rows.

    Attributes:
        manifest: the artifact's manifest.
        contract: the input contract (features, order, hash sizes or vocabularies,
            dense transforms).
        compiled: whether the program runs compiled (``load(..., compile=True)`` that
            succeeded).
    """

    def __init__(self, folder, manifest, module, vocabularies, compiled=False):
        self.folder = folder
        self.manifest = manifest
        self.contract = manifest["input"]
        self.module = module
        self.compiled = compiled
        self._hashers = {}
        self._sizes = torch.tensor([f["num_embeddings"] for f in self.contract["sparse"]],
                                   dtype=torch.int64)
        self._encoder = encoder_module().Encoder(self.contract, vocabularies,
                                                 self._string_hasher)

    # ---- model inputs ---------------------------------------------------------------------
    def check_inputs(self, dense, ids, lengths):
        """Raise :class:`ArtifactError` for inputs of the wrong shape or ids out of range."""
        num_sparse = len(self.contract["sparse"])
        num_dense = len(self.contract["dense"])
        if dense.dim() != 2 or dense.size(1) != num_dense:
            raise ArtifactError(f"dense must be (B, {num_dense}), got {tuple(dense.shape)}")
        batch = dense.size(0)
        if lengths.numel() != num_sparse * batch:
            raise ArtifactError(f"lengths must hold {num_sparse} x {batch} entries "
                                f"(features x batch, key-major), got {lengths.numel()}")
        if int(lengths.sum()) != ids.numel():
            raise ArtifactError(f"lengths sum to {int(lengths.sum())} but {ids.numel()} ids "
                                "were given")
        if ids.numel():
            per_feature = lengths.view(num_sparse, batch).sum(1)
            limit = torch.repeat_interleave(self._sizes, per_feature)
            bad = (ids < 0) | (ids >= limit)
            if bool(bad.any()):
                first = int(bad.nonzero()[0, 0])
                feature = int(torch.searchsorted(per_feature.cumsum(0), first, right=True))
                name = self.contract["sparse"][feature]["name"]
                raise ArtifactError(f"id {int(ids[first])} of feature {name!r} is outside "
                                    f"[0, {int(self._sizes[feature])})")

    def score(self, dense, ids, lengths):
        """Click probabilities (B,) for model inputs in the contract's order.

        Args:
            dense: (B, F_dense) float32, already transformed.
            ids: (N,) int64, feature after feature in ``contract["order"]``.
            lengths: (F * B,) int64, ids per (feature, sample), key-major.
        """
        dense = dense.to(torch.float32)
        ids, lengths = ids.to(torch.int64), lengths.to(torch.int64)
        self.check_inputs(dense, ids, lengths)
        with torch.no_grad():
            return self.module(dense, ids, lengths)

    # ---- raw columns and rows ---------------------------------------------------------------
    def input_columns(self):
        """The raw columns the model reads, in contract order (a timestamp column such as
        Avazu's ``hour`` in place of the features derived from it)."""
        return list(self._encoder.columns)

    def encode_columns(self, columns, n_rows):
        """Raw columns (name -> ``n_rows`` values; an absent column is missing) ->
        (dense (B, F) float32, ids (N,) int64, lengths (F * B,) int64) tensors.

        Raises:
            InputError: an unknown column, a bad value (naming column, row and what was
                expected), a column of another length.
        """
        try:
            dense, ids, lengths = self._encoder.encode(columns, n_rows)
        except encoder_module().EncodeError as exc:
            raise InputError(str(exc), exc.feature, exc.row, exc.expected) from None
        return torch.from_numpy(dense), torch.from_numpy(ids), torch.from_numpy(lengths)

    def score_columns(self, columns, n_rows):
        """Click probabilities (float32 numpy, row order) of raw columns."""
        if n_rows == 0:
            self.encode_columns(columns, 0)  # still refuses unknown columns
            return np.zeros(0, np.float32)
        return self.score(*self.encode_columns(columns, n_rows)).numpy()

    def encode(self, records):
        """Raw rows (a list of dicts: column -> raw value) -> (dense, ids, lengths)."""
        rows = list(records)
        return self.encode_columns(rows_to_columns(rows), len(rows))

    def predict_records(self, records):
        """Click probabilities (float32 numpy, row order) of raw rows (dicts)."""
        rows = list(records)
        return self.score_columns(rows_to_columns(rows), len(rows))

    def _string_hasher(self, feature):
        """The function strings -> ids of ``feature``, proven on the artifact's probes."""
        name = feature["name"]
        if name in self._hashers:
            return self._hashers[name]
        spec = self.contract.get("string_hash") or {}
        version = spec.get("version")
        if not feature.get("probes"):
            raise ArtifactError(f"feature {name!r} hashes strings, and the artifact was "
                                f"exported with another polars than the one that hashed the "
                                f"training data ({version}): re-export with polars "
                                f"{version}, or send ids (score) for it")
        try:
            import polars
        except ImportError:
            raise ArtifactError(f"feature {name!r} hashes strings with polars' hash, as the "
                                f"preprocess step did: install polars=={version} to score "
                                "raw rows, or send ids (score)") from None
        seed, size = int(spec.get("seed", 0)), int(feature["num_embeddings"])

        def hash_ids(values):
            series = polars.Series(values, dtype=polars.String)
            return ((series.hash(seed=seed) % size).cast(polars.Int64)).to_list()

        probes = [p for p, _ in feature["probes"]]
        if hash_ids(probes) != [int(i) for _, i in feature["probes"]]:
            raise ArtifactError(f"feature {name!r}: polars {polars.__version__} hashes "
                                f"strings differently from polars {version}, which hashed "
                                f"the training data: install polars=={version} to score "
                                "raw rows, or send ids (score)")
        self._hashers[name] = hash_ids
        return hash_ids


def rows_to_columns(rows):
    """Rows (dicts) -> columns (name -> list), every name any row has; a row without a
    column is missing there."""
    names = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InputError(f"row {i}: expected an object of column -> value, got "
                             f"{type(row).__name__}", None, i, "an object of column -> value")
        names.update(dict.fromkeys(row))
    return {name: [row.get(name) for row in rows] for name in names}


def load(folder, device="cpu", compile=False):
    """Verify and load an artifact folder; returns a :class:`ServingModel`.

    Args:
        folder: the artifact folder.
        device: where the tensors go.
        compile: compile the program with TorchInductor (module docstring); where that
            fails the program runs as exported, with a warning.
    """
    manifest = verify(folder)
    program = manifest["program"]
    if program.get("needs_fbgemm"):
        try:
            import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
        except Exception as exc:
            raise ArtifactError(f"the program runs FBGEMM's embedding kernel but fbgemm_gpu "
                                f"does not import: {exc}") from None
    state = {}
    for relative, entry in sorted(manifest["files"].items()):
        if not relative.endswith(".safetensors"):
            continue
        tensors = load_file(_join(folder, relative), device=str(device))
        # Floating-point tensors (the dense layers) into memory of torch's own allocator:
        # safetensors' tensors sit at any offset of the file's buffer, and MKL's GEMM sums
        # in an order that follows the operands' alignment, so the same layer scored 1 ulp
        # apart from the trained model's. The quantized tables (bytes) stay as loaded.
        tensors = {name: t.clone() if t.is_floating_point() else t
                   for name, t in tensors.items()}
        expected = set(entry.get("tensors", []))
        if set(tensors) != expected:
            raise ArtifactError(f"{_join(folder, relative)}: holds tensors "
                                f"{sorted(tensors)[:4]}... where the manifest lists "
                                f"{sorted(expected)[:4]}...")
        state.update(tensors)
    exported = torch.export.load(_join(folder, program["file"]))
    layout = program["state"]
    missing = sorted(set(layout) - set(state))
    if missing:
        raise ArtifactError(f"{folder}: no file holds the program's state {missing[:4]}")
    for name, spec in layout.items():
        tensor = state[name]
        if list(tensor.shape) != spec["shape"] or str(tensor.dtype) != spec["dtype"]:
            raise ArtifactError(f"{folder}: tensor {name!r} is {tuple(tensor.shape)} "
                                f"{tensor.dtype}, the program wants {spec['shape']} "
                                f"{spec['dtype']}")
        if name not in exported.state_dict:
            raise ArtifactError(f"{folder}: the program has no state {name!r}")
        if isinstance(exported.state_dict[name], torch.nn.Parameter):
            tensor = torch.nn.Parameter(tensor, requires_grad=False)
        exported.state_dict[name] = tensor
    vocabularies = {}
    for feature in manifest["input"]["sparse"]:
        if feature["mode"] == "vocab":
            with open(_join(folder, feature["vocabulary"])) as handle:
                vocabularies[feature["name"]] = json.load(handle)
    module, compiled = exported.module(), False
    if compile:
        contract = manifest["input"]
        try:
            module = compile_program(exported, len(contract["dense"]),
                                     len(contract["sparse"]), device)
            compiled = True
        except Exception as exc:  # no C++ compiler, an op Inductor cannot lower, ...
            reason = (str(exc).strip().splitlines() or [""])[0][:300]
            warnings.warn(f"{folder}: the program could not be compiled "
                          f"({type(exc).__name__}: {reason}); it runs as exported",
                          RuntimeWarning, stacklevel=2)
    return ServingModel(folder, manifest, module, vocabularies, compiled)


# ---- compiling ---------------------------------------------------------------------------------
COMPILE_BATCH = 512  # the batch the compiled layers are tuned for: a request of candidates


def compile_program(exported, num_dense, num_sparse, device="cpu", batch=COMPILE_BATCH):
    """``exported`` (a ``torch.export`` program) compiled by TorchInductor, warmed up.

    The program's oneDNN bfloat16 layers (``mkldnn._linear_pointwise`` with plain weights,
    which Inductor does not lower) are written back as ``linear`` + ``relu`` first; with
    ``freezing`` Inductor fuses them again, on weights prepacked for ``batch`` rows.
    Compiling happens in two warm-up calls, a batch of ``batch`` (a graph for every batch
    size but 1) and a batch of 1 (which torch specializes): no later call compiles again.

    Args:
        exported: the program, with its weights in place.
        num_dense, num_sparse: the input contract's feature counts (for the warm-up
            inputs).
        device: where the warm-up inputs go.
        batch: the batch size the layers are tuned for (others run, a little slower).

    Returns:
        A callable ``(dense, ids, lengths) -> probabilities``, as ``exported.module()``.

    Raises:
        Exception: whatever Inductor raises where it cannot compile.
    """
    module = exported.module()  # a fresh graph over the same weights
    _unfuse_linear_pointwise(module)
    # Flat arguments in, a tuple out: without the program's pytree code, whose guards fail
    # (and recompile, without the settings below) when a library registers pytree types.
    module.graph._codegen = torch.fx.graph.CodeGen()
    module.recompile()
    flat = torch.compile(module, dynamic=True)

    def compiled(dense, ids, lengths):
        return flat(dense, ids, lengths)[0]

    # Read when compiling only; torch.compile's own ``options`` do not carry ``freezing``.
    # ``emulate_precision_casts`` rounds where the program rounds (bfloat16 casts), which
    # keeps the scores the program's.
    with torch._inductor.config.patch(freezing=True, cpp_wrapper=True,
                                      emulate_precision_casts=True), torch.no_grad():
        for rows in (max(2, batch), 1):
            compiled(torch.zeros(rows, num_dense, device=device),
                     torch.zeros(num_sparse * rows, dtype=torch.int64, device=device),
                     torch.ones(num_sparse * rows, dtype=torch.int64, device=device))
    return compiled


def _unfuse_linear_pointwise(module):
    """Replace the graph's ``mkldnn._linear_pointwise`` calls by ``linear`` (+ ``relu``)."""
    fused = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    if fused is None:  # a torch without it exported no such call
        return
    graph = module.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not fused.default:
            continue
        x, weight, bias, activation = node.args[:4]
        if activation not in ("none", "relu"):
            raise ValueError(f"a fused layer with activation {activation!r}")
        with graph.inserting_before(node):
            out = graph.call_function(torch.ops.aten.linear.default, (x, weight, bias))
            if activation == "relu":
                out = graph.call_function(torch.ops.aten.relu.default, (out,))
        out.meta = dict(node.meta)
        node.replace_all_uses_with(out)
        graph.erase_node(node)
    graph.lint()
    module.recompile()
