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
    sparse.pt2, dense.pt2    format 2's stages: (ids, lengths) -> pooled, (dense, pooled) -> p
    dense.safetensors        the dense layers' parameters
    tables/shard-00000.safetensors ...   one file of quantized tables per serving shard
    serving_plan.json        which shard holds which table
    serving.py               this loader
    serving_encoder.py       raw columns -> model inputs (loaded by the loader)
    serving_timestamps.py    timestamp columns -> derived features (loaded by the encoder)
    serving_program.py       program.pt2's checks (before torch reads it) and the compiler

Nothing runs from the folder but this file: every file in it must be listed in the manifest,
no listed path may leave it, only regular files are opened, and ``program.pt2`` is checked
entry by entry before torch reads it (:func:`check_program_archive`). A folder signed with
``ctrctl quantize --sign KEY`` carries ``manifest.sig``; ``load(folder, verify_key=KEY)``
refuses one that is unsigned or signed with another key.

Example (load this file by its path, so that no other module resolves from the folder, and
write no ``__pycache__`` there: the folder holds listed files only):
    >>> import importlib.util, sys
    >>> sys.dont_write_bytecode = True
    >>> spec = importlib.util.spec_from_file_location("serving", "export/serving.py")
    >>> serving = importlib.util.module_from_spec(spec); spec.loader.exec_module(serving)
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
import hmac
import json
import os
import stat
import sys
import warnings

import numpy as np
import torch

FORMAT = "ctrctl.export"
FORMAT_VERSION = 2
#: 1: one program; 2: also its sparse and dense stages as programs of their own ("stages")
READS_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"  # HMAC-SHA256 of manifest.json's bytes under a shared key


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


#: The modules beside this loader, each ``serving_X.py`` in an artifact and the package's
#: ``standalone_X.py`` otherwise, loaded once from their text (never from ``sys.path``): the
#: encoder (raw columns -> model inputs) and the program's checks and compiler.
ENCODER_FILES = ("serving_encoder.py", "standalone_encoder.py")
PROGRAM_FILES = ("serving_program.py", "standalone_program.py")
_siblings: dict = {}  # files -> the module run from them


def _sibling(files):
    if files not in _siblings:
        here = os.path.dirname(os.path.abspath(__file__))
        path = next((os.path.join(here, n) for n in files
                     if os.path.isfile(os.path.join(here, n))), None)
        if path is None:
            raise ArtifactError(f"{here}: no {files[0]} beside the loader")
        _siblings[files] = run_source("_ctrctl_" + files[0][:-3], path)
    return _siblings[files]


def encoder_module():
    """The encoder module beside this file."""
    return _sibling(ENCODER_FILES)


def program_module():
    """The program's checks and compiler beside this file."""
    return _sibling(PROGRAM_FILES)


def run_source(name, path):
    """The module that ``path``'s source text makes, registered as ``name``: run from its
    text, so that no ``__pycache__`` is read or written in an artifact's folder (which
    holds the files its manifest lists, nothing else)."""
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    module = type(sys)(name)
    module.__file__ = path
    sys.modules[name] = module
    exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102  (a listed, hashed file)
    return module


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


def verify(folder, verify_key=None):
    """Read the manifest and check the folder against it; return the manifest.

    Every file it lists must be a regular file inside the folder with the listed size and
    sha256, and the folder must hold no file it does not list (but the manifest and its
    signature). With ``verify_key`` (the key's bytes, or the path of a key file) the
    manifest must carry a signature made with that key (:func:`sign`).
    """
    where = _join(folder, MANIFEST)
    try:
        handle, _ = _open_regular(where)
        with handle:
            raw = handle.read()
        manifest = json.loads(raw)
    except FileNotFoundError:
        raise ArtifactError(f"{where}: no manifest: not a ctrctl serving artifact") from None
    except ValueError as exc:  # not JSON, or not UTF-8
        raise ArtifactError(f"{where}: the manifest is not valid JSON ({exc})") from None
    if verify_key is not None:
        check_signature(folder, raw, verify_key)
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{where}: the manifest is not a JSON object")
    if manifest.get("format") != FORMAT:
        raise ArtifactError(f"{where}: format {manifest.get('format')!r} is not {FORMAT!r}")
    if manifest.get("format_version") not in READS_VERSIONS:
        raise ArtifactError(f"{where}: format version {manifest.get('format_version')} is "
                            f"not supported (this loader reads {READS_VERSIONS}): export it "
                            "again with this ctrctl, or load it with the ctrctl that wrote it")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise ArtifactError(f"{where}: 'files' must map each file's path to its sha256 and "
                            f"bytes, got {type(files).__name__}")
    for relative, entry in sorted(files.items()):
        path = _inside(folder, relative)
        if not (isinstance(entry, dict) and isinstance(entry.get("bytes"), int)
                and isinstance(entry.get("sha256"), str)):
            raise ArtifactError(f"{where}: the entry of {relative!r} needs 'sha256' (hex) and "
                                f"'bytes' (an integer), got {entry!r:.200}")
        handle, size = _open_regular(path)
        with handle:
            if size != entry["bytes"]:
                raise ArtifactError(f"{path}: {size} bytes where the manifest says "
                                    f"{entry['bytes']}: the file is truncated or replaced")
            if _sha256_handle(handle) != entry["sha256"]:
                raise ArtifactError(f"{path}: sha256 differs from the manifest's: the file "
                                    "was modified or swapped with another")
    check_listed(folder, files)
    return manifest


# ---- what the folder may hold (nothing runs from an artifact but serving.py) -------------------
def _inside(folder, relative):
    """The path of ``relative`` (a manifest's file or vocabulary path) in ``folder``;
    :class:`ArtifactError` where it is not a plain relative path or leaves the folder."""
    parts = relative.split("/") if isinstance(relative, str) else [""]
    if any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts):
        raise ArtifactError(f"{_join(folder, MANIFEST)}: the path {relative!r} is not a plain "
                            "relative path inside the artifact folder")
    path = _join(folder, relative)
    root, real = os.path.realpath(folder), os.path.realpath(path)
    if os.path.commonpath([root, real]) != root:
        raise ArtifactError(f"{path}: leaves the artifact folder (a symbolic link to {real}): "
                            "copy the file into the folder")
    return path


def _open_regular(path):
    """``(binary handle, size)`` of ``path``; :class:`ArtifactError` unless it is a regular
    file (opened without blocking: a FIFO or a device would hang or never end)."""
    try:
        # Looked at before opening (opening a device can act on it), then again on the open
        # file (the path may have been swapped in between).
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ArtifactError(f"{path}: not a regular file (a FIFO, device or folder): an "
                                "artifact holds files only")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        if path.endswith("/" + MANIFEST):
            raise
        raise ArtifactError(f"{path}: missing (the manifest lists it)") from None
    except OSError as exc:  # a folder where a file should be, no permission
        what = "the manifest" if path.endswith("/" + MANIFEST) else "it"
        raise ArtifactError(f"{path}: cannot read {what} ({exc.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ArtifactError(f"{path}: not a regular file (a FIFO, device or folder): an "
                            "artifact holds files only")
    return os.fdopen(fd, "rb"), info.st_size


def _sha256_handle(handle, chunk=1 << 20):
    digest = hashlib.sha256()
    for block in iter(lambda: handle.read(chunk), b""):
        digest.update(block)
    return digest.hexdigest()


def check_listed(folder, files):
    """:class:`ArtifactError` for the first file (or link) in ``folder`` that ``files`` (the
    manifest's) does not list: an unlisted module could be imported, or a file swapped in
    later."""
    for top, dirs, names in os.walk(folder):
        links = [d for d in dirs if os.path.islink(os.path.join(top, d))]
        for name in sorted(names + links):
            path = os.path.join(top, name)
            relative = os.path.relpath(path, folder).replace(os.sep, "/")
            if relative not in files and relative not in (MANIFEST, SIGNATURE):
                raise ArtifactError(f"{path}: not listed in the manifest: an artifact holds "
                                    "only the files it lists (remove it, or export again)")


# ---- signatures ---------------------------------------------------------------------------------
def read_key(key):
    """A signing key: ``key`` itself (bytes), or the bytes of the key file at ``key``."""
    if isinstance(key, bytes):
        data = key
    else:
        try:
            with open(key, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            raise ArtifactError(f"{key}: cannot read the key file ({exc.strerror})") from None
    if len(data) < 16:
        raise ArtifactError(f"{key if not isinstance(key, bytes) else 'the key'}: a key needs "
                            "at least 16 bytes (e.g. `head -c 32 /dev/urandom > KEY`)")
    return data


def _mac(manifest_bytes, key):
    return hmac.new(read_key(key), manifest_bytes, hashlib.sha256).hexdigest()


def sign(folder, key):
    """Write ``manifest.sig``: the HMAC-SHA256 of ``manifest.json`` under ``key`` (bytes,
    or a key file's path). The manifest lists every file's sha256, so this signs them all."""
    with open(_join(folder, MANIFEST), "rb") as handle:
        signature = {"algorithm": "hmac-sha256", "mac": _mac(handle.read(), key)}
    with open(_join(folder, SIGNATURE), "w") as handle:
        json.dump(signature, handle)


def check_signature(folder, manifest_bytes, key):
    """:class:`ArtifactError` unless ``manifest.sig`` is the manifest's MAC under ``key``."""
    where = _join(folder, SIGNATURE)
    try:
        handle, _ = _open_regular(where)
        with handle:
            signature = json.loads(handle.read())
        mac = signature["mac"] if signature.get("algorithm") == "hmac-sha256" else None
    except FileNotFoundError:
        raise ArtifactError(f"{where}: missing: the artifact is not signed (sign it with "
                            "`ctrctl quantize --sign KEY`)") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        mac = None
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(manifest_bytes, key)):
        raise ArtifactError(f"{where}: the signature does not match the manifest under this "
                            "key: the artifact was changed, or signed with another key")


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
        # The exported module's forward, past its per-call input-check hooks (~0.6 ms of a
        # 270-row call): :meth:`check_inputs` checks shapes, dtypes and id ranges first.
        self._forward = getattr(module, "forward", module)
        #: "sparse" and "dense" stage programs (format 2; empty for a format-1 artifact)
        self.stages = {}
        self.compiled = compiled
        self._hashers = {}
        self._raw_keys = torch.tensor([f["mode"] == "zch" for f in self.contract["sparse"]],
                                      dtype=torch.bool)
        #: feature position -> the keys owning a row (zch features; set by :func:`load`)
        self.zch_keys = {}
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
            # zch features carry raw keys, any int64: the program maps them to slots.
            raw = torch.repeat_interleave(self._raw_keys, per_feature)
            bad = ~raw & ((ids < 0) | (ids >= limit))
            if bool(bad.any()):
                first = int(bad.nonzero()[0, 0])
                feature = int(torch.searchsorted(per_feature.cumsum(0), first, right=True))
                name = self.contract["sparse"][feature]["name"]
                raise ArtifactError(f"id {int(ids[first])} of feature {name!r} is outside "
                                    f"[0, {int(self._sizes[feature])})")

    def default_row_lookups(self, ids, lengths):
        """Per managed-collision (zch) feature, how many of the inputs' raw keys own no row
        and score with the shared default row."""
        if not self.zch_keys:
            return {}
        sparse = self.contract["sparse"]
        chunks = torch.split(ids, lengths.view(len(sparse), -1).sum(1).tolist())
        return {sparse[f]["name"]: int((~torch.isin(chunks[f], owned)).sum())
                for f, owned in self.zch_keys.items()}

    def zch_occupancy(self):
        """Per zch feature, the share of its rows (less the default row) a key owns."""
        sparse = self.contract["sparse"]
        return {sparse[f]["name"]: owned.numel() / max(int(sparse[f]["num_embeddings"]) - 1, 1)
                for f, owned in self.zch_keys.items()}

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
            return self._forward(dense, ids, lengths)

    def pool(self, ids, lengths):
        """Format 2's sparse stage: pooled embeddings (B, F, D) in contract order."""
        batch = lengths.numel() // max(len(self.contract["sparse"]), 1)
        ids, lengths = ids.to(torch.int64), lengths.to(torch.int64)
        self.check_inputs(torch.empty(batch, len(self.contract["dense"])), ids, lengths)
        with torch.no_grad():
            return self.stages["sparse"](ids, lengths)

    def score_pooled(self, dense, pooled):
        """Format 2's dense stage: probabilities (B,) of dense (B, F_dense) and pooled (B, F, D);
        ``score_pooled(dense, pool(ids, lengths))`` is ``score``, bitwise."""
        if dense.dim() != 2 or pooled.dim() != 3 or pooled.size(0) != dense.size(0):
            raise ArtifactError(f"dense (B, F) and pooled (B, F, D) must agree, got "
                                f"{tuple(dense.shape)} and {tuple(pooled.shape)}")
        with torch.no_grad():
            return self.stages["dense"](dense.to(torch.float32), pooled)

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


def load(folder, device="cpu", compile=False, verify_key=None):
    """Verify and load an artifact folder; returns a :class:`ServingModel`.

    Args:
        folder: the artifact folder.
        device: where the tensors go.
        compile: compile the program with TorchInductor (module docstring); where that
            fails the program runs as exported, with a warning.
        verify_key: require a signature made with this key (bytes, or a key file's path;
            :func:`sign`); None loads signed and unsigned folders alike.
    """
    manifest = verify(folder, verify_key=verify_key)
    program = manifest.get("program")
    if not isinstance(program, dict) or not isinstance(manifest.get("input"), dict):
        raise ArtifactError(f"{_join(folder, MANIFEST)}: 'program' and 'input' must be JSON "
                            "objects")
    if program.get("file") not in manifest["files"]:
        raise ArtifactError(f"{_join(folder, MANIFEST)}: the program file "
                            f"{program.get('file')!r} is not among the listed files")
    check_program_archive(_join(folder, program["file"]))
    if program.get("needs_fbgemm"):
        try:
            import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
        except Exception as exc:
            raise ArtifactError(f"the program runs FBGEMM's embedding kernel but fbgemm_gpu "
                                f"does not import: {exc}") from None
    programs = program_module()
    try:
        state = programs.read_state(manifest["files"], lambda f: _join(folder, f), device)
        exported = torch.export.load(_join(folder, program["file"]))
        programs.fill_state(exported, program["state"], state, folder)
        stages = {name: programs.load_stage(
            _join(folder, stage["file"]) if stage["file"] in manifest["files"] else None,
            {n: program["state"][n] for n in stage["state"]}, state, folder)
            for name, stage in (manifest.get("stages") or {}).items()}
    except programs.ProgramError as exc:
        raise ArtifactError(str(exc)) from None
    except (KeyError, TypeError) as exc:
        raise ArtifactError(f"{_join(folder, MANIFEST)}: a malformed 'stages' entry ({exc})"
                            ) from None
    vocabularies = {}
    zch = [i for i, f in enumerate(manifest["input"]["sparse"]) if f["mode"] == "zch"]
    # The program's read-only remaps, in contract order: owned keys, then int64-max padding.
    zch_keys = {f: state[f"remaps.{i}.index_keys"][:int(
        (state[f"remaps.{i}.index_slots"] != 0).sum())] for i, f in enumerate(zch)}
    for feature in manifest["input"]["sparse"]:
        if feature["mode"] == "vocab":
            vocabularies[feature["name"]] = _read_vocabulary(folder, manifest, feature)
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
    serving = ServingModel(folder, manifest, module, vocabularies, compiled)
    serving.zch_keys = zch_keys
    serving.stages = stages
    return serving


def _read_vocabulary(folder, manifest, feature):
    """A vocabulary feature's key -> id map, from a file the manifest lists (and hashed)."""
    relative = feature.get("vocabulary")
    if relative not in manifest["files"]:
        raise ArtifactError(f"{_join(folder, MANIFEST)}: the vocabulary {relative!r} of "
                            f"feature {feature.get('name')!r} is not among the listed files")
    handle, _ = _open_regular(_inside(folder, relative))
    try:
        with handle:
            vocabulary = json.loads(handle.read())
    except ValueError as exc:
        raise ArtifactError(f"{_join(folder, relative)}: not a JSON vocabulary ({exc})") from None
    if not isinstance(vocabulary, dict):
        raise ArtifactError(f"{_join(folder, relative)}: a vocabulary is a JSON object")
    return vocabulary


# ---- the program: checked before torch reads it, compiled on request (serving_program.py) --------
def check_program_archive(path):
    """Refuse a ``torch.export`` archive that loading could unpickle or run code from
    (:class:`ArtifactError`); the checks are ``serving_program.py``'s."""
    program = program_module()
    try:
        program.check_program_archive(path)
    except program.ProgramError as exc:
        raise ArtifactError(str(exc)) from None


def compile_program(exported, num_dense, num_sparse, device="cpu", batch=None):
    """``exported`` compiled by TorchInductor and warmed up (``serving_program.py``)."""
    program = program_module()
    return program.compile_program(exported, num_dense, num_sparse, device=device,
                                   batch=batch or program.COMPILE_BATCH)
