"""The worker's export (weights and one batch, torch::pickle_save), read so that only tensors can
come out, and copied into the PyTorch GPT."""
import collections
import functools
import io
import pickle
import zipfile

import torch

from .common import fail


def cpp_name(python_name):
    """blocks.3.qkv.weight -> block3.qkv.weight (the C++ module path)."""
    if python_name.startswith("blocks."):
        _, index, rest = python_name.split(".", 2)
        return f"block{index}.{rest}"
    return python_name


STORAGE_DTYPES = {"FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
                  "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
                  "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool"}


class TensorsOnlyUnpickler(pickle.Unpickler):
    """Reads a torch.save-format archive into tensors and plain containers, and nothing else: the
    pickle may name only the tensor rebuild function, storage classes, OrderedDict (a tensor's
    empty hooks) and restore_type_tag, and each resolves to a function of this class that builds
    data. Storages are the archive's raw bytes, little-endian as written on this machine."""

    class Storage:
        def __init__(self, name):
            self.dtype = getattr(torch, STORAGE_DTYPES[name])

    def __init__(self, archive, pickle_name):
        super().__init__(io.BytesIO(archive.read(pickle_name)))
        self.archive, self.folder = archive, pickle_name[: -len("data.pkl")]

    def find_class(self, module, name):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda storage, offset, size, stride, *rest: storage.as_strided(size, stride, offset)
        if module == "torch" and name in STORAGE_DTYPES:
            return functools.partial(TensorsOnlyUnpickler.Storage, name)
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch.jit._pickle", "restore_type_tag"):
            return lambda value, type_string: value
        raise pickle.UnpicklingError(f"the file names {module}.{name}, which is not part of a tensor")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        storage_type, key = pid[1], pid[2]
        if not isinstance(storage_type, functools.partial) or storage_type.func is not TensorsOnlyUnpickler.Storage:
            raise pickle.UnpicklingError(f"persistent id {pid!r} does not name a storage class")
        dtype = storage_type().dtype
        data = bytearray(self.archive.read(f"{self.folder}data/{key}"))
        return torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)


def read_export(path):
    """The worker's export, read so that it can only produce tensors in plain containers.

    torch::pickle_save follows each typed dict (Dict[str, Tensor], Dict[str, Any]) with a call of
    torch.jit._pickle.restore_type_tag(dict, "Dict[str, Tensor]"), PyTorch's own function that
    returns the dict unchanged (the tag matters to TorchScript only). torch.load(weights_only=True)
    allows tensors and containers but not that function, so PyTorch 2.6, where weights_only=True is
    the default, refuses the file. Where torch.serialization.safe_globals exists (2.5+) the load is
    torch.load(weights_only=True) with that one function allowlisted for this call. Older versions
    (1.13) have no allowlist and ignore a pickle_module unless weights_only=False: there the archive
    is read by TensorsOnlyUnpickler above, which builds tensors from the stored bytes itself."""
    import torch.jit._pickle as jit_pickle

    safe_globals = getattr(torch.serialization, "safe_globals", None)
    try:
        if safe_globals is not None:
            with safe_globals([jit_pickle.restore_type_tag]):
                return torch.load(path, weights_only=True)
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            if len(pickles) != 1:
                raise pickle.UnpicklingError(f"expected one */data.pkl in the archive, found {len(pickles)}")
            return TensorsOnlyUnpickler(archive, pickles[0]).load()
    except Exception as e:  # noqa: BLE001 - any unpickling failure is the same user-facing error
        fail(f"cannot load the worker's export {path} (tensors only): {e}")


def load_export(model, path, args):
    """Copies the worker's exported weights into `model`; returns (tokens, targets)."""
    export = read_export(path)
    if not isinstance(export, dict) or not {"weights", "tokens", "targets"} <= set(export):
        fail(f"{path}: expected a dict with 'weights', 'tokens' and 'targets', got "
             f"{sorted(export) if isinstance(export, dict) else type(export).__name__}")
    weights = dict(export["weights"])
    ours = {cpp_name(n): p for n, p in model.named_parameters()}
    problems = [f"missing in the export: {n}" for n in sorted(set(ours) - set(weights))]
    problems += [f"not in the PyTorch model: {n}" for n in sorted(set(weights) - set(ours))]
    problems += [f"{n}: export {tuple(weights[n].shape)}, PyTorch {tuple(p.shape)}"
                 for n, p in sorted(ours.items()) if n in weights and weights[n].shape != p.shape]
    if problems:
        fail("the exported weights do not match the PyTorch GPT:\n  " + "\n  ".join(problems))
    with torch.no_grad():
        for n, p in ours.items():
            p.copy_(weights[n])
    tokens, targets = export["tokens"], export["targets"]
    for name, t in (("tokens", tokens), ("targets", targets)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or tuple(t.shape) != (args.batch, args.seq):
            fail(f"export's {name}: expected int64 of shape ({args.batch}, {args.seq}), got "
                 f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    return tokens.contiguous(), targets.contiguous()
