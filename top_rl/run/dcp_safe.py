"""Reading a torch DCP checkpoint directory (torch.distributed.checkpoint) without running code from it.

A DCP directory (the trainer state of a checkpoint, top_rl.run.dist_state) holds
  .metadata          DCP's index: which tensor chunk lies where; a pickle, which `FileSystemReader` reads with
                     plain `pickle.load`
  __R_0.distcp       rank R's records, each one tensor as a small `torch.save` zip, which DCP reads with
                     `torch.load(weights_only=True)`
So the one place DCP itself would run code is `.metadata`. Here it is refused by name before it is unpickled (the
objects it names, read by top_rl.run.pickle_scan without running it, must all be DCP's own metadata classes, torch
sizes and dtypes: METADATA_ALLOWED) and is then unpickled by an Unpickler whose `find_class` builds nothing else
(`SafeReader`, the reader the trainer loads with). `refusal` also reads every record the index points at and names
any that holds Python objects beyond tensors (top_rl.run.safe_load's allowlist), so a tampered record is refused by
name before Ray starts, as a tampered .pt file is. Trainer state written by top-rl holds tensors only: no DCP
"bytes" items, which DCP's default planner would load with `torch.load(weights_only=False)`; `SafeReader` refuses
any index that lists one.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

METADATA = ".metadata"

# module -> names the index may name (and the unpickler may build)
METADATA_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "TensorStorageMetadata", "ChunkStorageMetadata",
                                              "TensorProperties", "MetadataIndex", "StorageMeta",
                                              "_MEM_FORMAT_ENCODING"},  # an Enum
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch": {"Size", "strided", "contiguous_format", "preserve_format",
              "float32", "float64", "float16", "bfloat16", "uint8", "int8", "int16", "int32", "int64", "bool"},
    "torch.serialization": {"_get_layout"},  # a lookup of torch's layouts by name
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "Path"},  # the directory DCP wrote to (a path object)
    "copyreg": {"__newobj__", "_reconstructor"},
    "builtins": {"object", "set", "frozenset", "tuple", "list", "dict"},
    "collections": {"OrderedDict"},
}


def _allowed(name: str) -> bool:
    module, _, attr = name.rpartition(".")
    return attr in METADATA_ALLOWED.get(module, ())


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if name not in METADATA_ALLOWED.get(module, ()):
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a DCP index")
        return super().find_class(module, name)


def read_metadata(path: str | Path):
    """The DCP index at `path`: its names checked first (none outside METADATA_ALLOWED), then unpickled by an
    Unpickler that builds nothing else. ValueError naming what it holds otherwise."""
    from top_rl.run import pickle_scan

    data = Path(path).read_bytes()
    names, unreadable = pickle_scan.named_objects(io.BytesIO(data))
    unsafe = sorted({n for n in names if not _allowed(n)})
    if unsafe:
        raise UnsafeIndex(unsafe)
    if unreadable is not None:
        raise ValueError(f"not a whole pickle ({unreadable})")
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata

    metadata = _Unpickler(io.BytesIO(data)).load()
    if not isinstance(metadata, Metadata):
        raise ValueError(f"holds a {type(metadata).__name__}, not a DCP index")
    for key, meta in metadata.state_dict_metadata.items():
        if isinstance(meta, BytesStorageMetadata):  # loaded with weights_only=False by DCP: top-rl writes none
            raise UnsafeIndex([f"a bytes item {key!r}"])
    return metadata


class UnsafeIndex(ValueError):
    def __init__(self, names: list[str]):
        self.names = names
        super().__init__(f"names Python objects other than DCP's index ({', '.join(names)})")


def refusal(directory: str | Path) -> tuple[str, str, bool] | None:
    """Why the DCP directory cannot be loaded safely: (file, why, unsafe), `unsafe` when it would hold code rather
    than merely being unreadable; None when every record the index lists is tensors and plain data (module doc)."""
    from top_rl.run import safe_load

    directory = Path(directory)
    try:
        metadata = read_metadata(directory / METADATA)
    except UnsafeIndex as e:
        return METADATA, f"{e}: top-rl loads no code from a checkpoint", True
    except Exception as e:  # noqa: BLE001 - any other failure: unreadable, named
        return METADATA, f"unreadable ({type(e).__name__}: {e})", False
    by_file: dict[str, list] = {}
    for info in metadata.storage_data.values():
        by_file.setdefault(str(info.relative_path), []).append(info)
    for name, infos in sorted(by_file.items()):
        path = directory / name
        if Path(name).name != name or not path.is_file():
            return name, "missing (listed in the DCP index)", False
        data = path.read_bytes()
        for info in infos:
            record = data[info.offset: info.offset + info.length]
            if info.transform_descriptors or len(record) != info.length:
                return name, f"record at byte {info.offset} is not a plain tensor record", False
            try:
                names = safe_load.unsafe_globals(io.BytesIO(record))
            except Exception as e:  # noqa: BLE001
                return name, f"unreadable record at byte {info.offset} ({type(e).__name__}: {e})", False
            if names:
                return (name, f"holds Python objects other than tensors and plain data ({', '.join(names)}): "
                        "top-rl loads no code from a checkpoint", True)
    return None


def reader(directory: str | Path):
    """A DCP FileSystemReader whose index is read by `read_metadata` (module doc)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            if kwargs.get("rank") is not None:
                raise ValueError("per-rank DCP indexes are not part of a top-rl checkpoint")
            metadata = read_metadata(Path(self.path) / METADATA)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(directory))
