"""B10M: the trained tokens of a Mixture of two packed streams weighted web 0.7 : code 0.3,
counted (not timed) over one loader epoch: each source's share of the token slots (what
the weights count: a position is one sequence of seq_len + 1 slots) and of the real tokens
(padding excluded), in modes "concat" and "fit", with small and large shards."""

from __future__ import annotations

import os
import tempfile

import numpy

from dist_resume import Mixture, ResumableDataLoader
from dist_resume.packing import collate_packed

from .packing_workloads import document_lengths, packed_documents, write_shards
from .report import FigureResult
from .timing import Stats

SEQ_LEN = 2048
WEIGHTS = {"web": 0.7, "code": 0.3}
CODE_VOCABULARY = (50_000, 65_000)  # code's token ids; web's are below


def shares(mixture: Mixture) -> tuple[dict[str, tuple[float, float]], int]:
    """Each source's (share of the token slots, share of the real tokens) over a loader
    epoch, and the sequences it trained."""
    slots = dict.fromkeys(mixture.names, 0)
    real = dict.fromkeys(mixture.names, 0)
    for batch in ResumableDataLoader(mixture, batch_size=16, collate_fn=collate_packed, drop_last=True):
        for first, count in zip(batch["tokens"][:, 0].tolist(), batch["num_tokens"].tolist()):
            name = "code" if first >= CODE_VOCABULARY[0] else "web"
            slots[name] += SEQ_LEN + 1
            real[name] += count
    sequences = sum(slots.values()) // (SEQ_LEN + 1)
    return {name: (slots[name] / sum(slots.values()), real[name] / sum(real.values())) for name in mixture.names}, \
        sequences


def run(quick: bool) -> list[FigureResult]:
    result = FigureResult("B10M", "share of a Mixture's trained tokens, weights web 0.7 : code 0.3", "")
    documents = 480 if quick else 2400
    with tempfile.TemporaryDirectory(prefix="dist-resume-b10m-") as root:
        for per_shard in (documents // 40, documents // 4):
            shards = documents // per_shard
            web = write_shards(os.path.join(root, f"web-{per_shard}"), document_lengths(shards, per_shard, seed=2))
            code_lengths = [numpy.clip(sizes // 3, 16, None) for sizes in document_lengths(shards, per_shard, seed=3)]
            code = write_shards(os.path.join(root, f"code-{per_shard}"), code_lengths, CODE_VOCABULARY)
            for mode in ("concat", "fit"):
                sources = {"web": packed_documents(web, SEQ_LEN, mode), "code": packed_documents(code, SEQ_LEN, mode)}
                case = f"{mode}, {shards} shards of {per_shard} documents a source"
                measured, sequences = shares(Mixture(sources, WEIGHTS))
                for name, (slot, real) in measured.items():
                    result.add(case, f"{name}: token slots", Stats.exact(slot))
                    result.add(case, f"{name}: real tokens", Stats.exact(real))
                result.add(case, "sequences trained", Stats.exact(sequences))
    result.notes += [
        f"web: documents of log-normal lengths around 700 tokens (16 to 16,384); code: a third of that (at least "
        f"16). seq_len {SEQ_LEN}; one loader epoch of the Mixture (its length: both sources' sequences), global "
        "batch 16, the final partial batch dropped.",
        "Token slots follow the weights exactly up to the composition's rounding (within one sequence per window "
        "for two sources, Mixture.window_bound). Real tokens differ by each source's padding: in 'concat' only "
        "the last sequence of each shard is padded, in 'fit' every sequence that a document did not fit into.",
    ]
    return [result]
