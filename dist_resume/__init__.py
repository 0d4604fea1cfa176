"""dist-resume: exact, elastic mid-epoch resume for PyTorch training jobs."""

from .loader import ResumableDataLoader
from .remap import ResumePlan, plan_resume
from .state import ResumeStateError

__all__ = ["ResumableDataLoader", "ResumePlan", "ResumeStateError", "plan_resume"]
