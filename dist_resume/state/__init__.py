"""The loader's saved-state format (G5, G6): the int64 fields of each rank's entry and the
keys around them (`fields`), decoding and checking a loaded state (`saved`), the batches
delivered beyond the consumed prefix with in_order=False (`delivered`), the ranges
`loader.skip` passed over (`skips`), every saved rank's copy of one field in one tensor
(`rank_table`), and the same state as JSON text (`json_form`). Imports
`randomness` (seeds) only: everything that saves or reads a loader state stands on it."""

from dist_resume.state.fields import ResumeStateError
from dist_resume.state.json_form import state_from_json, state_to_json
from dist_resume.state.skips import SkippedRange

__all__ = ["ResumeStateError", "SkippedRange", "state_from_json", "state_to_json"]
