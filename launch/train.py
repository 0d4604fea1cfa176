"""The example training job: a small DDP classifier that resumes exactly where it stopped.

Usage (see launch/singlenode.sh, multinode.sh, elastic.sh):
    .venv/bin/torchrun --nproc-per-node 2 launch/train.py --checkpoint ./runs/ckpt --epochs 2
    .venv/bin/python launch/train.py --help

The job's code is dist_resume/demo/train.py, inside the package, so that `dist-resume demo`
runs it after any install; this file is its entry point for torchrun and the launch scripts.
"""

from dist_resume.demo.train import main

if __name__ == "__main__":
    main()
