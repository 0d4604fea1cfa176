"""B10M: the trained tokens of a Mixture of two packed streams weighted web 0.7 : code 0.3,
counted (not timed) over one loader epoch: code's share of the real tokens (padding
excluded) and of the token slots (a position is one sequence of seq_len + 1 slots), with
weights that count real tokens (weigh='tokens', the default) and samples, in modes
"concat" and "fit", with small and large shards; and the largest gap, in sequences, of a
global step's code tokens from 0.3 of the step's real tokens."""

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


def shares(mixture: Mixture) -> tuple[float, float, float, int]:
    """Code's share of the real tokens and of the token slots over a loader epoch, the
    largest gap of a global step's code tokens from its weight's share of the step's real
    tokens (in sequences), and the sequences trained."""
    slots = real = code_slots = code_real = 0
    gap = 0.0
    for batch in ResumableDataLoader(mixture, batch_size=16, collate_fn=collate_packed, drop_last=True):
        code = (batch["tokens"] >= CODE_VOCABULARY[0]).any(dim=1)  # not the first token: it may be EOS
        counts = batch["num_tokens"]
        step_code, step_real = int(counts[code].sum()), int(counts.sum())
        gap = max(gap, abs(step_code - WEIGHTS["code"] * step_real) / (SEQ_LEN + 1))
        slots += len(counts) * (SEQ_LEN + 1)
        code_slots += int(code.sum()) * (SEQ_LEN + 1)
        real, code_real = real + step_real, code_real + step_code
    return code_real / real, code_slots / slots, gap, slots // (SEQ_LEN + 1)


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
                for weigh in ("tokens", "samples"):
                    case = f"{mode}, {shards} shards of {per_shard} documents a source, weigh={weigh!r}"
                    real, slots, gap, sequences = shares(Mixture(sources, WEIGHTS, weigh=weigh))
                    result.add(case, "code: real tokens", Stats.exact(real))
                    result.add(case, "code: token slots", Stats.exact(slots))
                    result.add(case, "largest step gap (sequences)", Stats.exact(gap))
                    result.add(case, "sequences trained", Stats.exact(sequences))
    result.notes += [
        f"web: documents of log-normal lengths around 700 tokens (16 to 16,384); code: a third of that (at least "
        f"16). seq_len {SEQ_LEN}; one loader epoch of the Mixture (its length: both sources' sequences), global "
        "batch 16, the final partial batch dropped.",
        "weigh='tokens': the real tokens follow the weights within half a sequence since the stage began and one "
        "sequence per global step (two sources; Mixture.window_bound), exactly in 'concat' (each shard's real "
        "tokens are counted), at the average fill in 'fit'. weigh='samples': the token slots follow the weights; "
        "the real tokens differ by each source's padding (in 'concat' the last sequence of each shard, in 'fit' "
        "every sequence a document did not fit into). The step gap: |code's real tokens - 0.3 x the step's real "
        "tokens| / (seq_len + 1).",
    ]
    return [result]
