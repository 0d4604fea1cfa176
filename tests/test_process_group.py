"""`shut_down_distributed` at a job's end: a script that runs with or without torchrun
calls it unconditionally."""

from __future__ import annotations

import torch.distributed as dist

from dist_resume import shut_down_distributed


def test_without_a_process_group_it_does_nothing() -> None:
    assert not dist.is_initialized()
    shut_down_distributed()
    assert not dist.is_initialized()
