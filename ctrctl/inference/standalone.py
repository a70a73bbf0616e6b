"""Load and run a ctrctl serving artifact with torch, fbgemm_gpu and safetensors alone.

This file is copied into every artifact as ``serving.py`` and must not import ctrctl: it
imports only torch, safetensors and the standard library (and fbgemm_gpu, which registers
the embedding kernel's op, when the program uses it). Raw rows of string features
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
    >>> model.predict_records([{"I1": "3", "C1": "68fd1e64", ...}])     # [0.031, ...]
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
import re
import stat
import warnings
import zipfile

import torch
from safetensors.torch import load_file

FORMAT = "ctrctl.export"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"  # HMAC-SHA256 of manifest.json's bytes under a shared key


class ArtifactError(Exception):
    """A serving artifact that cannot be used: what is wrong, and in which file."""


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
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{where}: format version {manifest.get('format_version')} is "
                            f"not supported (this loader reads {FORMAT_VERSION})")
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


# ---- the program archive: refused before torch reads it where it could unpickle or run code -----
_ARCHIVE_FILES = {"archive_format", "archive_version", "byteorder", ".data/version",
                  ".data/serialization_id", "models/model.json", "data/sample_inputs/model.pt",
                  "data/weights/model_weights_config.json",
                  "data/constants/model_constants_config.json"}
_PAYLOADS = {"weights": re.compile(r"weight_[0-9]+"), "constants": re.compile(r"tensor_[0-9]+")}
_OPERATOR = re.compile(r"torch\.ops\.[a-z_][a-z0-9_]*\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+"
                       r"|_operator\.[a-z_]+|math\.[a-z_]+")
# Shape expressions (sympy, parsed by eval) and guards (compiled to Python): these tokens only.
_SYMPY = re.compile(r"(?:Symbol|Integer|Rational|Mul|Add|Pow|Max|Min|Mod|FloorDiv|CeilToInt"
                    r"|FloorToInt|positive|integer|nonnegative|True|False|'[a-z]+[0-9]+'"
                    r"|[a-z]+[0-9]+|[0-9]+|[-+*/(),=\s])*")
_GUARD = re.compile(r"(?:L\['[A-Za-z_][A-Za-z0-9_]*'\]|\.size\(\)|\.stride\(\)|\[[0-9]+\]"
                    r"|[0-9]+|and|or|not|[-+*/%<>=!()\s])*")


def check_program_archive(path):
    """Refuse a ``torch.export`` archive that loading could unpickle or run code from.

    ``torch.export.load`` unpickles any weight or constant whose config says
    ``use_pickle``, custom objects, sample inputs and legacy archives, evaluates shape
    expressions and compiles guards into Python. This loader's programs hold raw tensors,
    no sample inputs, ATen/FBGEMM operators and plain shape guards: anything else is an
    :class:`ArtifactError` before torch sees the file.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            roots = {name.split("/", 1)[0] for name in names}
            if len(roots) != 1 or len(set(names)) != len(names):
                raise ArtifactError(f"{path}: not a torch.export archive (one root folder, "
                                    "no entry twice)")
            root = roots.pop() + "/"
            for name in names:
                relative = name[len(root):]
                folder, _, base = relative.rpartition("/")
                payload = _PAYLOADS.get(folder.rpartition("/")[2]) if folder.startswith("data/") else None
                if relative not in _ARCHIVE_FILES and not (payload and payload.fullmatch(base)):
                    raise ArtifactError(f"{path}: unexpected entry {name!r}: this loader reads "
                                        "programs of raw tensors only")
            if archive.getinfo(root + "data/sample_inputs/model.pt").file_size:
                raise ArtifactError(f"{path}: the program carries sample inputs (a pickle)")
            for kind in _PAYLOADS:
                config = json.loads(archive.read(f"{root}data/{kind}/model_{kind}_config.json"))
                for fqn, entry in config["config"].items():
                    if entry.get("use_pickle") is not False or not _PAYLOADS[kind].fullmatch(
                            str(entry.get("path_name"))):
                        raise ArtifactError(f"{path}: {kind} {fqn!r} is stored as a pickle, "
                                            "which loading would run: refused")
            _check_graph(path, json.loads(archive.read(root + "models/model.json")))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, ValueError, TypeError,
            AttributeError) as exc:
        raise ArtifactError(f"{path}: not a torch.export program this loader reads "
                            f"({type(exc).__name__}: {str(exc)[:200]})") from None


def _check_graph(path, program):
    """Operators, shape expressions and guards of a serialized program (see above)."""
    pending = [program]
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        for key, value in item.items():
            if key == "target" and isinstance(value, str) and not _OPERATOR.fullmatch(value):
                raise ArtifactError(f"{path}: the program calls {value!r:.100}, not an "
                                    "operator: refused")
            if key == "expr_str" and not _SYMPY.fullmatch(str(value)):
                raise ArtifactError(f"{path}: a shape expression {value!r:.100} is refused")
            pending.append(value)
    for text in list(program.get("range_constraints") or {}) + list(program.get("guards_code")
                                                                     or []):
        if not (_SYMPY.fullmatch(text) or _GUARD.fullmatch(text)):
            raise ArtifactError(f"{path}: a shape guard {text!r:.100} is refused")


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
        self.compiled = compiled
        self._vocab = vocabularies
        self._hashers = {}
        self._sizes = torch.tensor([f["num_embeddings"] for f in self.contract["sparse"]],
                                   dtype=torch.int64)

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

    # ---- raw rows ---------------------------------------------------------------------------
    def encode(self, records):
        """Raw rows (a list of dicts: feature -> raw value) -> (dense, ids, lengths)."""
        rows = list(records)
        dense_cols = []
        for feature in self.contract["dense"]:
            dense_cols.append(_dense_column(feature, [r.get(feature["name"]) for r in rows]))
        if dense_cols:
            dense = torch.stack(dense_cols, dim=1)
        else:
            dense = torch.zeros(len(rows), 0)
        ids, lengths = [], []
        for feature in self.contract["sparse"]:
            name = feature["name"]
            if feature["mode"] == "hash" and feature.get("type") == "string":
                per_row = self._string_ids(feature, [_raw_keys(feature, row.get(name))
                                                     for row in rows])
            else:
                per_row = [_sparse_ids(feature, _raw_keys(feature, row.get(name)),
                                       self._vocab.get(name)) for row in rows]
            for keys in per_row:
                ids.extend(keys)
                lengths.append(len(keys))
        return dense, torch.tensor(ids, dtype=torch.int64), torch.tensor(lengths,
                                                                          dtype=torch.int64)

    def _string_ids(self, feature, keys_per_row):
        """Ids of a string-hashed feature: the preprocess step's hash (polars' ``hash`` with
        the recorded seed, modulo the hash size; missing -> 0), all rows in one call."""
        hash_ids = self._string_hasher(feature)
        flat = [k for keys in keys_per_row for k in keys if k is not None]
        hashed = iter(hash_ids([str(k) for k in flat]) if flat else [])
        return [[0 if k is None else next(hashed) for k in keys] for keys in keys_per_row]

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

    def predict_records(self, records):
        """Click probabilities (a list of floats) for raw rows."""
        rows = list(records)
        if not rows:
            return []
        return self.score(*self.encode(rows)).tolist()


def _missing(value):
    return value is None or value == "" or (isinstance(value, float) and value != value)


def _dense_column(feature, values):
    fill = float(feature.get("fill", 0.0))
    parsed = []
    for value in values:
        if _missing(value):
            parsed.append(fill)
            continue
        try:
            parsed.append(float(value))
        except (TypeError, ValueError):
            raise ArtifactError(f"dense feature {feature['name']!r}: {value!r} is not a "
                                "number") from None
    column = torch.tensor(parsed, dtype=torch.float64)
    transform = feature.get("transform", "none")
    if transform == "log1p":
        column = column.clamp(min=0.0).log1p()
    elif transform == "clip":
        low, high = feature["clip"]
        column = column.clamp(low, high)
    return column.to(torch.float32)


def _key(feature, text):
    kind = feature.get("type")
    try:
        if kind == "hex":
            return int(str(text), 16)
        if kind in ("int", "id"):
            return int(float(text)) if isinstance(text, float) else int(str(text))
    except ValueError:
        raise ArtifactError(f"sparse feature {feature['name']!r}: {text!r} is not a "
                            f"{kind} value") from None
    return str(text)


def _raw_keys(feature, value):
    """A raw field -> its keys: ``[None]`` when missing (a list feature: ``[]``), the parts
    of a list feature split on its separator (empty parts dropped), else ``[value]``."""
    separator = feature.get("separator")
    if _missing(value):
        return [] if separator else [None]
    if separator:
        return [part for part in str(value).split(separator) if part != ""]
    return [value]


def _sparse_ids(feature, keys, vocabulary):
    """Ids of one row's keys of an id, hash (hex or int) or vocabulary feature."""
    mode, size = feature["mode"], feature["num_embeddings"]
    out = []
    for raw in keys:
        if mode == "id":
            key = 0 if raw is None else _key(feature, raw)
            if not 0 <= key < size:
                raise ArtifactError(f"id {key} of feature {feature['name']!r} is outside "
                                    f"[0, {size})")
            out.append(key)
        elif mode == "hash":
            out.append(0 if raw is None else _key(feature, raw) % size)  # floor modulo
        else:
            name = "null" if raw is None else str(_key(feature, raw))
            out.append(int(vocabulary.get(name, 0)))
    return out


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
    return ServingModel(folder, manifest, module, vocabularies, compiled)


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
