"""The program of a ctrctl serving artifact: checked before torch reads it, compiled on request.

Copied into every artifact as ``serving_program.py`` beside the loader (``serving.py``), which
runs it from its text after checking its sha256 against the manifest. Like the loader it must
not import ctrctl: torch and the standard library only.
"""

import json
import re
import zipfile

import torch


class ProgramError(Exception):
    """The archive is not a program this loader reads (the loader says it as an
    ``ArtifactError``)."""


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
    :class:`ProgramError` before torch sees the file.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            roots = {name.split("/", 1)[0] for name in names}
            if len(roots) != 1 or len(set(names)) != len(names):
                raise ProgramError(f"{path}: not a torch.export archive (one root folder, "
                                    "no entry twice)")
            root = roots.pop() + "/"
            for name in names:
                relative = name[len(root):]
                folder, _, base = relative.rpartition("/")
                payload = _PAYLOADS.get(folder.rpartition("/")[2]) if folder.startswith("data/") else None
                if relative not in _ARCHIVE_FILES and not (payload and payload.fullmatch(base)):
                    raise ProgramError(f"{path}: unexpected entry {name!r}: this loader reads "
                                        "programs of raw tensors only")
            if archive.getinfo(root + "data/sample_inputs/model.pt").file_size:
                raise ProgramError(f"{path}: the program carries sample inputs (a pickle)")
            for kind in _PAYLOADS:
                config = json.loads(archive.read(f"{root}data/{kind}/model_{kind}_config.json"))
                for fqn, entry in config["config"].items():
                    if entry.get("use_pickle") is not False or not _PAYLOADS[kind].fullmatch(
                            str(entry.get("path_name"))):
                        raise ProgramError(f"{path}: {kind} {fqn!r} is stored as a pickle, "
                                            "which loading would run: refused")
            _check_graph(path, json.loads(archive.read(root + "models/model.json")))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, ValueError, TypeError,
            AttributeError) as exc:
        raise ProgramError(f"{path}: not a torch.export program this loader reads "
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
                raise ProgramError(f"{path}: the program calls {value!r:.100}, not an "
                                    "operator: refused")
            if key == "expr_str" and not _SYMPY.fullmatch(str(value)):
                raise ProgramError(f"{path}: a shape expression {value!r:.100} is refused")
            pending.append(value)
    for text in list(program.get("range_constraints") or {}) + list(program.get("guards_code")
                                                                     or []):
        if not (_SYMPY.fullmatch(text) or _GUARD.fullmatch(text)):
            raise ProgramError(f"{path}: a shape guard {text!r:.100} is refused")


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


# ---- the program's weights, and the stages of a format-2 artifact ------------------------------
def read_state(files, join, device="cpu"):
    """Name -> tensor of every safetensors file the manifest lists (``files``: relative path
    -> entry with its ``tensors``); ``join`` makes a relative path the file's path."""
    from safetensors.torch import load_file

    state = {}
    for relative, entry in sorted(files.items()):
        if not relative.endswith(".safetensors"):
            continue
        tensors = load_file(join(relative), device=str(device))
        # Floating-point tensors (the dense layers) into memory of torch's own allocator:
        # safetensors' tensors sit at any offset of the file's buffer, and MKL's GEMM sums
        # in an order that follows the operands' alignment, so the same layer scored 1 ulp
        # apart from the trained model's. The quantized tables (bytes) stay as loaded.
        tensors = {name: t.clone() if t.is_floating_point() else t
                   for name, t in tensors.items()}
        expected = set(entry.get("tensors", []))
        if set(tensors) != expected:
            raise ProgramError(f"{join(relative)}: holds tensors {sorted(tensors)[:4]}... "
                               f"where the manifest lists {sorted(expected)[:4]}...")
        state.update(tensors)
    return state


def fill_state(exported, layout, state, where):
    """Put the artifact's tensors into ``exported`` (a program saved without weights).

    Args:
        exported: the loaded ``torch.export`` program.
        layout: name -> {"shape", "dtype"}: the tensors the manifest says it takes.
        state: name -> tensor, read from the artifact's safetensors files.
        where: the artifact folder (for messages).

    Raises:
        ProgramError: a tensor missing, of another shape or dtype, or unknown to the program.
    """
    missing = sorted(set(layout) - set(state))
    if missing:
        raise ProgramError(f"{where}: no file holds the program's state {missing[:4]}")
    for name, spec in layout.items():
        tensor = state[name]
        if list(tensor.shape) != spec["shape"] or str(tensor.dtype) != spec["dtype"]:
            raise ProgramError(f"{where}: tensor {name!r} is {tuple(tensor.shape)} "
                               f"{tensor.dtype}, the program wants {spec['shape']} "
                               f"{spec['dtype']}")
        if name not in exported.state_dict:
            raise ProgramError(f"{where}: the program has no state {name!r}")
        if isinstance(exported.state_dict[name], torch.nn.Parameter):
            tensor = torch.nn.Parameter(tensor, requires_grad=False)
        exported.state_dict[name] = tensor


def load_stage(path, layout, state, where):
    """One stage program of a format-2 artifact (``sparse``: ``(ids, lengths) -> pooled
    (B, F, D)``; ``dense``: ``(dense, pooled) -> probabilities``), checked and filled with
    the artifact's tensors (the same tensors as the whole program: nothing is copied).

    Returns:
        The stage's forward: a callable on tensors.
    """
    if path is None:
        raise ProgramError(f"{where}: a stage program is not among the manifest's files")
    check_program_archive(path)
    exported = torch.export.load(path)
    fill_state(exported, layout, state, where)
    module = exported.module()
    return module.forward  # past the per-call constraint hooks (the loader checks inputs)
