"""The command line on damaged checkpoints and large jobs (issue 11, point 10): one line per
failure, never a traceback; ``plan`` costs O(ranks), says when the global batch changes;
``inspect`` tells a live elastic plan from one the ranks have left behind."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dist_resume.checkpoint.save import save_checkpoint
from dist_resume.checkpoint.step_dirs import step_dir_name
from dist_resume.cli import main
from dist_resume.loader.resumable import ResumableDataLoader
from dist_resume.state.fields import RankState, encode, plan_digest
from tests.layout import committed_dir
from tests.merged_states import merged, merged_from

from .hostile_files import ROOT, read_metadata, run_fenced


def _run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _loaders(world_size: int, batch_size: int, length: int = 20) -> list[ResumableDataLoader]:
    return [ResumableDataLoader(list(range(length)), batch_size=batch_size, shuffle=True, seed=5, rank=rank,
                                world_size=world_size) for rank in range(world_size)]


def _save(loaders: list[ResumableDataLoader], url: Path, step: int = 1) -> None:
    save_checkpoint({"loader": merged_from(loaders)}, str(url), step)


@pytest.mark.parametrize("marker,problem", [
    ({}, "its commit marker has no 'step'"),
    ({"step": 1, "world_size": 1}, "its commit marker has no 'committed_at'"),
    ({"step": 1, "world_size": 1, "committed_at": float("nan")}, "its commit marker has committed_at nan"),
    ({"step": 1, "world_size": 1, "committed_at": 1e300}, "its commit marker has committed_at 1e+300"),
    ({"step": 1, "world_size": "1", "committed_at": 0}, "its commit marker has world_size '1'"),
    ({"step": 2, "world_size": 1, "committed_at": 0}, "its commit marker names step 2"),
    ([1], "its commit marker is not a JSON object"),
])
def test_a_damaged_commit_marker_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                            marker: object, problem: str) -> None:
    """``ls`` and ``inspect`` both read the step's marker and say the same of it (issue 32
    point 4); a damaged index entry is ignored: the index only saves requests."""
    _save(_loaders(1, 3), tmp_path)
    (entry,) = (tmp_path / ".commits").iterdir()
    entry.unlink()  # an entry of the form written before names said more: its content is read
    (tmp_path / ".commits" / step_dir_name(1)).write_text(json.dumps(marker))
    code, out, err = _run(capsys, "ls", str(tmp_path))
    assert (code, err) == (0, "") and out.splitlines()[1].split()[0] == "1"
    (tmp_path / step_dir_name(1) / ".committed").write_text(json.dumps(marker))
    for command in ("ls", "inspect"):
        assert _run(capsys, command, str(tmp_path)) == (
            1, "", f"dist-resume: error: step 1 at {tmp_path} is damaged: {problem}\n")


def test_inspect_on_a_zeroed_shard_is_one_line_without_unsafe_advice(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    _save(_loaders(1, 3), tmp_path)
    step_dir = committed_dir(tmp_path, 1)
    (shard,) = {info.relative_path for info in read_metadata(step_dir).storage_data.values()}
    (step_dir / shard).write_bytes(bytes((step_dir / shard).stat().st_size))
    code, out, err = _run(capsys, "inspect", str(tmp_path))
    assert (code, out) == (1, "")
    assert re.fullmatch(rf"dist-resume: error: tensor 'loader\.[\w.]+' of step 1 at {re.escape(str(tmp_path))} is "
                        r"damaged: not a stored torch value \(BadZipFile: File is not a zip file\)\n", err)
    assert "weights_only" not in err


def test_inspect_on_garbage_metadata_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _save(_loaders(1, 3), tmp_path)
    metadata = committed_dir(tmp_path, 1) / ".metadata"
    metadata.write_bytes(metadata.read_bytes()[:40])
    code, out, err = _run(capsys, "inspect", str(tmp_path))
    assert (code, out) == (1, "")
    assert err.startswith(f"dist-resume: error: refused to load {metadata}: not a DCP metadata file (")
    assert err.count("\n") == 1


def test_plan_of_a_huge_epoch_costs_o_ranks(tmp_path: Path) -> None:
    """10**12 samples: listing what each rank consumes must not walk the epoch. 24 consumed,
    999999999976 left = 111111111108 global batches of 9 and 4 samples, padded to 2 per rank."""
    length, batch = 10**12, 3
    plan = plan_digest([])
    entries = []
    for rank in range(2):
        state = RankState(version=1, dataset_length=length, seed=5, shuffle=0, drop_last=0, even_batches=1,
                          sampling=0, epoch=0, world_size=2, rank=rank, batch_size=batch, global_batch=2 * batch,
                          batches_consumed=4, samples_consumed=4 * batch, epoch_finished=0, plan_digest=plan)
        entries.append(encode(state, []))
    save_checkpoint({"loader": merged(*entries)}, str(tmp_path), 1)
    result = run_fenced("-m", "dist_resume", "plan", str(tmp_path), "--world-size", "3")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines() == [
        "step 1: resuming at world size 3, per-rank batch 3 (global batch 9); saved at world size 2, per-rank batch 3",
        "  the global batch changes from 6 to 9: the saved per-rank batch 3 is kept, as a resumed loader with the "
        "same batch_size does; --batch-size 2 keeps it at 6",
        "  epoch 0: every rank continues it; then epoch 1 starts from its beginning",
        "  positions are places in epoch 0's sample order, 0 to 999999999999 (as plan_resume and "
        "padding_positions report them); padding repeats the epoch's first positions",
        "  rank 0: 111111111109 batches, 333333333326 samples; "
        "positions 24-26, 33-35, 42-44, 51-53, 60-62, 69-71, ...",
        "  rank 1: 111111111109 batches, 333333333326 samples; "
        "positions 27-29, 36-38, 45-47, 54-56, 63-65, 72-74, ...",
        "  rank 2: 111111111109 batches, 333333333324 samples + 2 padding; "
        "positions 30-32, 39-41, 48-50, 57-59, 66-68, 75-77, ...",
    ]


def test_plan_refuses_a_world_size_beyond_the_bound(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "URL", "--world-size", "100000000"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "dist-resume: error: argument --world-size: must be <= 1048576, got 100000000 (see 'dist-resume plan --help')\n")


@pytest.mark.parametrize("argv,line", [
    ([], "  the global batch changes from 12 to 30: the saved per-rank batch 6 is kept, as a resumed loader with the "
         "same batch_size does; no per-rank batch keeps it at 12 with 5 ranks"),
    (["--batch-size", "4"], "  the global batch changes from 12 to 20"),
    (["--batch-size", "12", "--world-size", "1"], None),  # 12 stays 12: nothing to say
])
def test_plan_says_when_the_global_batch_changes(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                 argv: list[str], line: str | None) -> None:
    loaders = _loaders(2, 6, length=100)
    for loader in loaders:
        next(iter(loader))
    _save(loaders, tmp_path)
    world_size = [] if "--world-size" in argv else ["--world-size", "5"]
    code, out, err = _run(capsys, "plan", str(tmp_path), *world_size, *argv)
    assert (code, err) == (0, "")
    second = out.splitlines()[1]
    if line is None:
        assert second.startswith("  epoch 0: every rank continues it")
    else:
        assert second == line


def test_inspect_after_the_elastic_epoch_ended(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A job resumed elastically in epoch 0 keeps that plan; once every rank is in epoch 1
    the plan no longer applies and inspect says so."""
    old = _loaders(2, 3)
    for loader in old:
        next(iter(loader))
    state = merged_from(old)
    new = _loaders(3, 2)
    for loader in new:
        loader.load_state_dict(state)
        list(loader)  # the rest of epoch 0
        next(iter(loader))  # the first batch of epoch 1
    _save(new, tmp_path)
    code, out, err = _run(capsys, "inspect", str(tmp_path))
    assert (code, err) == (0, "")
    assert out.splitlines()[3:] == [
        "  the re-partition saved for epoch 0 by a resume at another world size no longer applies: every rank is "
        "past that epoch",
        "  rank 0: epoch 1 (in progress), 1 batches = 2 samples consumed this epoch",
        "  rank 1: epoch 1 (in progress), 1 batches = 2 samples consumed this epoch",
        "  rank 2: epoch 1 (in progress), 1 batches = 2 samples consumed this epoch",
    ]


def test_plan_piped_into_head_stops_quietly(tmp_path: Path) -> None:
    """``dist-resume plan ... | head``: the reader leaves early; no BrokenPipeError traceback."""
    loaders = _loaders(2, 3)
    for loader in loaders:
        next(iter(loader))
    _save(loaders, tmp_path)
    process = subprocess.Popen([sys.executable, "-m", "dist_resume", "plan", str(tmp_path), "--world-size", "200000"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert process.stdout.readline().startswith(b"step 1: resuming at world size 200000")
    process.stdout.close()
    _, err = process.communicate(timeout=120)
    assert (process.returncode, err) == (141, b"")
