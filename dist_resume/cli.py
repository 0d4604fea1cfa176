"""The ``dist-resume`` command: the demo, and a look into checkpoints without running a job.

Every failure is one line on stderr (``dist-resume: error: ...``) and a non-zero exit code.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from dist_resume.arguments import checked_url
from dist_resume.checkpoint.load import list_checkpoints, read_loader_states
from dist_resume.errors import CheckpointError
from dist_resume.mixtures.inspection import describe as describe_mixture
from dist_resume.positions.remap import ResumePlan, plan_resume
from dist_resume.state.fields import MAX_WORLD_SIZE, RankState, ResumeStateError
from dist_resume.state.saved import decode
from dist_resume.state.skips import saved_ledger

PROG = "dist-resume"


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


def _count(minimum: int, maximum: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {value}")
        return value

    return parse


def _url(text: str) -> str:
    try:
        return checked_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("url ")) from None


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Exact, elastic mid-epoch resume for PyTorch: demo and checkpoint tools.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    demo = commands.add_parser("demo", help="train, crash, resume at 2 -> 3 -> 1 processes, verify")
    demo.add_argument("--checkpoint", type=_url, metavar="URL",
                      help="where checkpoints go: path, s3://bucket/prefix... (default: WORKDIR/checkpoints)")
    demo.add_argument("--workdir", type=Path, metavar="DIR",
                      help="logs and records (default: ./runs/demo-<time>)")
    demo.add_argument("--dataset-size", type=_count(1), default=100, metavar="N",
                      help="samples in the synthetic dataset (default: %(default)s)")
    demo.add_argument("--global-batch", type=_count(1), metavar="B",
                      help="samples per global step, a multiple of 6: split over 2, 3 and 1 processes (default: 12)")
    demo.add_argument("--save-every", type=_count(1), metavar="STEPS",
                      help="global steps between checkpoints (default: 2)")
    demo.add_argument("--seed", type=_count(0), default=0, help="the loader's seed (default: %(default)s)")
    demo.add_argument("--num-workers", type=_count(0), default=0, metavar="W",
                      help="loader worker processes per rank (default: %(default)s)")
    demo.add_argument("--timeout", type=_count(1), default=300, metavar="SECONDS",
                      help="limit for each launch of the job (default: %(default)s)")
    demo.add_argument("--torchft", action="store_true",
                      help="instead: 3 replica groups under torchft (a lighthouse on 127.0.0.1) die, come back and "
                           "join while the job trains on; needs the torchft extra")

    ls = commands.add_parser("ls", help="committed checkpoints: step, time, world size, size")
    ls.add_argument("url", type=_url, help="checkpoint location (path, file://, s3://...)")

    inspect = commands.add_parser("inspect", help="the data loader state of a checkpoint, rank by rank")
    inspect.add_argument("url", type=_url, help="checkpoint location (path, file://, s3://...)")
    inspect.add_argument("--step", type=_count(0), help="committed step (default: the latest)")
    inspect.add_argument("--key", default="loader", help="state dict key of the loader (default: loader)")

    plan = commands.add_parser("plan", help="what each rank would consume after resuming at another world size")
    plan.add_argument("url", type=_url, help="checkpoint location (path, file://, s3://...)")
    plan.add_argument("--world-size", type=_count(1, MAX_WORLD_SIZE), required=True, metavar="M",
                      help="number of ranks to resume at (required)")
    plan.add_argument("--batch-size", type=_count(1), metavar="B",
                      help="per-rank batch size after the resume (default: the saved one, as a resumed "
                           "loader built with the same batch_size; the global batch then changes with M)")
    plan.add_argument("--step", type=_count(0), help="committed step (default: the latest)")
    plan.add_argument("--key", default="loader", help="state dict key of the loader (default: loader)")
    return parser


# ------------------------------------------------------------------ commands

def _demo(args: argparse.Namespace) -> int:
    from dist_resume.demo.job import JobError
    from dist_resume.demo.run import (
        DemoConfig,
        DemoError,
        DemoUsageError,
        default_checkpoint,
        default_workdir,
        run_demo,
    )

    workdir = args.workdir or default_workdir()
    if args.torchft:
        return _torchft_demo(args, workdir)
    config = DemoConfig(workdir=workdir, checkpoint=args.checkpoint or default_checkpoint(workdir),
                        dataset_size=args.dataset_size, global_batch=args.global_batch or 12,
                        save_every=args.save_every or 2, seed=args.seed, num_workers=args.num_workers,
                        timeout=args.timeout)
    try:
        verdict = run_demo(config)
    except DemoUsageError as exc:
        raise _Usage(str(exc), "demo") from None
    except (DemoError, JobError) as exc:
        raise _Failure(str(exc)) from None
    return 0 if verdict.passed else 1


def _torchft_demo(args: argparse.Namespace, workdir: Path) -> int:
    from dist_resume.demo.job import JobError
    from dist_resume.demo.torchft_run import TorchftDemoConfig, TorchftDemoError, run_torchft_demo

    given = [option for option, value in (("--checkpoint", args.checkpoint), ("--global-batch", args.global_batch),
                                          ("--save-every", args.save_every)) if value is not None]
    if given:
        verb = "does" if len(given) == 1 else "do"
        raise _Usage(f"{' and '.join(given)} {verb} not apply to --torchft (its groups read no checkpoint)", "demo")
    config = TorchftDemoConfig(workdir=workdir, dataset_size=args.dataset_size, seed=args.seed,
                               num_workers=args.num_workers, timeout=args.timeout)
    try:
        return 0 if run_torchft_demo(config).exact else 1
    except (TorchftDemoError, JobError) as exc:
        raise _Failure(str(exc)) from None


def _size(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError


def _ls(args: argparse.Namespace) -> int:
    infos = list_checkpoints(args.url)
    if not infos:
        raise _Failure(f"no committed checkpoint at {args.url}")
    rows = [("step", "committed at", "world size", "size")]
    for info in infos:
        when = datetime.datetime.fromtimestamp(info.committed_at).strftime("%Y-%m-%d %H:%M:%S")
        rows.append((str(info.step), when, str(info.world_size), _size(info.size_bytes)))
    _table(rows)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    step, state = read_loader_states(args.url, args.step, key=args.key)
    saved = decode(state)
    first = saved.any
    print(f"step {step}: data loader state of {len(saved.ranks)} rank(s) under {args.key!r}")
    print(f"  dataset {first.dataset_length} samples, seed {first.seed}, shuffle {_on(first.shuffle)}, "
          f"drop_last {_on(first.drop_last)}, even_batches {_on(first.even_batches)}")
    print(f"  saved at world size {first.world_size}, per-rank batch {first.batch_size} "
          f"(global batch {first.global_batch})")
    if saved.plan_values:
        plan_epoch = saved.plan_values[0]  # Plan.encode: [epoch, levels, ...]
        if any(rank_state.epoch == plan_epoch for rank_state in saved.ranks.values()):
            print(f"  epoch {plan_epoch} was resumed at another world size or batch size: the re-partition of "
                  f"its remaining samples is saved with the state ({len(saved.plan_values)} integers)")
        else:
            print(f"  the re-partition saved for epoch {plan_epoch} by a resume at another world size no longer "
                  "applies: every rank is past that epoch")
    for rank, rank_state in sorted(saved.ranks.items()):
        where = "finished" if rank_state.epoch_finished else "in progress"
        print(f"  rank {rank}: epoch {rank_state.epoch} ({where}), {rank_state.batches_consumed} batches "
              f"= {rank_state.samples_consumed} samples consumed this epoch")
        if rank in saved.delivered:  # in_order=False
            ahead = saved.delivered[rank]
            print(f"    out of order: its batches up to {ahead.frontier - 1} were consumed too, except "
                  f"{', '.join(map(str, ahead.holes))}")
    ledger = saved_ledger(state, sorted(saved.ranks))
    if ledger.ranges:
        print("  skipped by loader.skip(), never trained (global batches and positions of each epoch):")
        for skipped in ledger.ranges:
            print(f"    {skipped}")
    for line in describe_mixture(state, saved):
        print(line)
    return 0


def _plan(args: argparse.Namespace) -> int:
    step, state = read_loader_states(args.url, args.step, key=args.key)
    saved = decode(state).any
    plan = plan_resume(state, args.world_size, args.batch_size)
    layout = plan.layout
    print(f"step {step}: resuming at world size {layout.world_size}, per-rank batch {layout.batch_size} "
          f"(global batch {layout.global_batch}); saved at world size {saved.world_size}, per-rank batch "
          f"{saved.batch_size}")
    if layout.global_batch != saved.global_batch:
        print("  " + _global_batch_change(saved, plan, args.batch_size is None))
    if not any(plan.remaining_batches(rank) for rank in range(layout.world_size)):
        print(f"  epoch {plan.epoch} is finished: every rank starts epoch {plan.epoch + 1} from its beginning")
        return 0
    print(f"  epoch {plan.epoch}: every rank continues it; then epoch {plan.epoch + 1} starts from its beginning")
    print(f"  positions are places in epoch {plan.epoch}'s sample order, 0 to {saved.dataset_length - 1} (as "
          "plan_resume and padding_positions report them); padding repeats the epoch's first positions")
    for rank in range(layout.world_size):
        print(f"  rank {rank}: {_rank_summary(plan, rank)}")
    return 0


def _global_batch_change(saved: RankState, plan: ResumePlan, default_batch: bool) -> str:
    old, new, world_size = saved.global_batch, plan.layout.global_batch, plan.layout.world_size
    if not default_batch:
        return f"the global batch changes from {old} to {new}"
    keeps = (f"--batch-size {old // world_size} keeps it at {old}" if old % world_size == 0
             else f"no per-rank batch keeps it at {old} with {world_size} ranks")
    return (f"the global batch changes from {old} to {new}: the saved per-rank batch {saved.batch_size} is kept, "
            f"as a resumed loader with the same batch_size does; {keeps}")


def _rank_summary(plan: ResumePlan, rank: int, limit: int = 6) -> str:
    """Batches, samples and the first position ranges rank ``rank`` consumes next, in work
    independent of the epoch's length."""
    layout, first, stop = plan.layout, plan.consumed[rank], plan.layout.num_batches(rank)
    slots = layout.slots_before(rank, stop) - layout.slots_before(rank, first)
    padding = layout.batch(rank, stop - 1).padding if stop > first else 0
    spans: list[list[int]] = []
    index = first
    while index < stop and len(spans) <= limit:
        batch = layout.batch(rank, index)
        for start, count in plan.plan.runs(batch.start, batch.stop):
            if spans and start == spans[-1][1] + 1:
                spans[-1][1] = start + count - 1
            else:
                spans.append([start, start + count - 1])
        index += 1
    words = [f"{a}-{b}" if b > a else str(a) for a, b in spans[:limit]]
    more = ", ..." if len(spans) > limit or index < stop else ""
    pad = f" + {padding} padding" if padding else ""
    return f"{stop - first} batches, {slots - padding} samples{pad}; positions {', '.join(words) or 'none'}{more}"


def _on(flag: int) -> str:
    return "on" if flag else "off"


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


class _Usage(Exception):
    """Options a command cannot run with, found after parsing: exit 2, as argparse's errors."""

    def __init__(self, message: str, command: str) -> None:
        super().__init__(f"{message} (see '{PROG} {command} --help')")


class _Failure(Exception):
    """A command's failure, reported as one line."""


_COMMANDS = {"demo": _demo, "ls": _ls, "inspect": _inspect, "plan": _plan}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dist-resume``; return its exit code (0 ok, 1 failure or failed verdict, 2 usage)."""
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except _Usage as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except (_Failure, CheckpointError, ResumeStateError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (`dist-resume plan ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
