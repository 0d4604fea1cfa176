"""A second job saving into a run URL, stopped at a chosen point of its save (issue 11 point 1).

``python tests/concurrent_writer.py '<json args>'`` saves ``{"w": full(value)}`` as ``step``
under ``url``. When it opens for writing the first file whose name contains ``block_at``
(``.distcp``: before its shard; ``.metadata``: after its shard, before DCP's metadata) it
creates ``<handshake>/ready`` and waits for ``<handshake>/go``. Its outcome ("committed" or
the error) goes to ``<handshake>/outcome``. It saves without the run's writer lease: two
jobs then write at once, as they can only in the instant between a job's last lease check
and its commit marker, widened here to a whole save.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _pausing(base: type, block_at: str, handshake: Path) -> type:
    class Pausing(base):  # type: ignore[misc, valid-type]
        paused = False

        def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
            if "w" in mode and block_at in path and not Pausing.paused:
                Pausing.paused = True
                (handshake / "ready").write_text(path)
                while not (handshake / "go").exists():  # released by the test, whatever the timing
                    time.sleep(0.01)
            return super()._open(path, mode, *args, **kwargs)

    return Pausing


def main(args: dict[str, Any]) -> None:
    import fsspec
    import torch
    from fsspec.implementations.local import LocalFileSystem

    from dist_resume import save_checkpoint
    from dist_resume.checkpoint import save
    from dist_resume.errors import CheckpointError

    handshake = Path(args["handshake"])
    url = args["url"]
    if url.startswith("s3://"):
        import s3fs

        fsspec.register_implementation("s3", _pausing(s3fs.S3FileSystem, args["block_at"], handshake), clobber=True)
    else:
        fsspec.register_implementation("file", _pausing(LocalFileSystem, args["block_at"], handshake), clobber=True)
    save.hold_lease = save.confirm_lease = lambda store: None
    try:
        save_checkpoint({"w": torch.full((4,), float(args["value"]))}, url, args["step"])
        outcome = "committed"
    except CheckpointError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    (handshake / "outcome").write_text(outcome)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
