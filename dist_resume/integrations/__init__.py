"""Glue for the frameworks people train with: one module per framework (`lightning`,
`accelerate`, `transformers`, `torchft`), each importing it lazily (dist_resume itself never
needs them). The top of the library: imports `loader`, `positions` and `state`; nothing in the
package but its face (`dist_resume`) and the demo imports it."""

from dist_resume.integrations.lightning import LightningLoader
from dist_resume.integrations.torchft import ManagedLoader
from dist_resume.integrations.transformers import ResumableTrainerMixin

__all__ = ["LightningLoader", "ManagedLoader", "ResumableTrainerMixin"]
