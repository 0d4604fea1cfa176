"""G8: loading runs no code from the checkpoint."""

from __future__ import annotations

import enum
import io
import os
import pathlib
import pickle
import re
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from dist_resume.checkpoint.load import load_checkpoint
from dist_resume.checkpoint.metadata_unpickler import unpickle_metadata
from dist_resume.checkpoint.save import save_checkpoint
from dist_resume.errors import UnsafeCheckpointError
from tests.hostile_files import run_fenced
from tests.layout import committed_dir


class MakesDirectory:
    """Unpickling this calls os.mkdir(path): a visible side effect standing in for any code."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (os.mkdir, (self.path,))


def test_crafted_metadata_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    save_checkpoint({"weights": torch.ones(3)}, str(tmp_path), 1)
    side_effect = tmp_path / "pwned"
    metadata = committed_dir(tmp_path, 1) / ".metadata"
    real = pickle.loads(metadata.read_bytes())
    real.planner_data["weights"] = MakesDirectory(side_effect)  # hidden deep inside
    crafted = pickle.dumps(real)
    metadata.write_bytes(crafted)

    message = (f"refused to load {metadata}: global 'posix.mkdir' is not allowed; "
               "only DCP metadata types and plain data are")
    with pytest.raises(UnsafeCheckpointError, match=f"^{re.escape(message)}$"):
        load_checkpoint({"weights": torch.zeros(3)}, str(tmp_path))
    assert not side_effect.exists()
    pickle.loads(crafted)  # control: the payload is live with a plain unpickler
    assert side_effect.is_dir()


def test_crafted_stored_value_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    side_effect = tmp_path / "pwned"
    save_checkpoint({"weights": torch.ones(3), "extra": MakesDirectory(side_effect)}, str(tmp_path), 1)
    message = (f"refused to load stored value 'extra' of step 1 at {tmp_path}: it is not plain data "
               "(global 'posix.mkdir' is not allowed)")
    with pytest.raises(UnsafeCheckpointError, match=f"^{re.escape(message)}$"):
        load_checkpoint({"weights": torch.zeros(3), "extra": None}, str(tmp_path))
    assert not side_effect.exists()
    # control: DCP's own loader executes it
    dcp.load({"weights": torch.zeros(3), "extra": None}, checkpoint_id=str(committed_dir(tmp_path, 1)))
    assert side_effect.is_dir()


def test_dcp_metadata_of_every_kind_of_entry_is_admitted(tmp_path: Path) -> None:
    """What DCP itself writes (dtypes, layouts, memory formats, nested values, lists, the
    local Path it records) passes the restricted unpickler unchanged."""
    state = {
        "f": torch.randn(2, 3), "h": torch.zeros(2, dtype=torch.bfloat16), "i": torch.arange(4),
        "c": torch.ones(1, 2, 2, 2).to(memory_format=torch.channels_last),
        "nested": {"lst": [torch.ones(1), {"a": 1}], "plain": {"s": "x", "t": (1, 2.0, None)}},
    }
    dcp.save(state, checkpoint_id=str(tmp_path))
    data = (tmp_path / ".metadata").read_bytes()
    assert unpickle_metadata(data, "test") == pickle.loads(data)


def test_not_metadata_is_refused() -> None:
    with pytest.raises(UnsafeCheckpointError, match=r"^refused to load x: holds a dict, not DCP Metadata$"):
        unpickle_metadata(pickle.dumps({"a": 1}), "x")
    with pytest.raises(UnsafeCheckpointError, match=r"^refused to load x: not a DCP metadata file \(UnpicklingError: "):
        unpickle_metadata(b"garbage", "x")



def _pickle_enums_by_name(value: object) -> bytes:
    """Pickles as Debian's Python 3.11.2 and CPython 3.12+ do: every enum member as
    getattr(its class, its name) (the demo's checkpoints were refused on such a machine)."""
    class ByName(pickle.Pickler):
        def reducer_override(self, obj: object):
            if isinstance(obj, enum.Enum):
                return getattr, (type(obj), obj.name)
            return NotImplemented

    buffer = io.BytesIO()
    ByName(buffer, protocol=4).dump(value)
    return buffer.getvalue()


class _Getattr:
    def __init__(self, owner: object, name: str) -> None:
        self.owner, self.name = owner, name

    def __reduce__(self) -> tuple:
        return (getattr, (self.owner, self.name))


def test_enum_members_pickled_by_name_are_admitted_and_nothing_else_is(tmp_path: Path) -> None:
    dcp.save({"c": torch.ones(1, 2, 2, 2).to(memory_format=torch.channels_last), "f": torch.ones(3)},
             checkpoint_id=str(tmp_path))
    metadata = pickle.loads((tmp_path / ".metadata").read_bytes())
    data = _pickle_enums_by_name(metadata)
    assert b"getattr" in data
    assert unpickle_metadata(data, "x") == metadata
    with pytest.raises(UnsafeCheckpointError, match=r"^refused to load x: global 'posix.system' is not allowed"):
        unpickle_metadata(pickle.dumps(_Getattr(os.system, "__call__")), "x")
    with pytest.raises(UnsafeCheckpointError, match=r"^refused to load x: getattr\(<class 'pathlib.PosixPath'>, 'cwd'\) is not allowed"):
        unpickle_metadata(pickle.dumps(_Getattr(pathlib.PosixPath, "cwd")), "x")


@pytest.mark.parametrize("name", ["_inductor", "_dynamo", "onnx"])
@pytest.mark.parametrize("reader", ["unpickle_metadata", "load_stored"])
def test_a_refused_torch_name_is_never_imported(reader: str, name: str) -> None:
    """torch imports some submodules lazily on attribute access: refusing ``torch.<name>``
    must not look it up there (``torch._inductor`` is 198 modules, with code of its own)."""
    payload = b"\x80\x02ctorch\n" + name.encode() + b"\n."
    script = f"""
import sys
from dist_resume.checkpoint.metadata_unpickler import unpickle_metadata
from dist_resume.checkpoint.stored_values import load_stored
from tests.hostile_files import archive
data = {payload!r} if {reader!r} == "unpickle_metadata" else archive({payload!r})
before = set(sys.modules)
try:
    {reader}(data, "crafted")
except Exception as exc:
    print(type(exc).__name__, exc)
print("imported:", sorted(m for m in set(sys.modules) - before if m.startswith("torch.{name}")))
"""
    result = run_fenced("-c", script)
    refusal = {"unpickle_metadata": f"refused to load crafted: global 'torch.{name}' is not allowed; "
                                    "only DCP metadata types and plain data are",
               "load_stored": f"refused to load crafted: it is not plain data (global 'torch.{name}' is not allowed)"}
    assert result.stdout.splitlines() == [f"UnsafeCheckpointError {refusal[reader]}", "imported: []"], \
        result.stderr[-2000:]
