"""Where a packed stream's padding falls in an epoch: in mode "concat" each shard's last
sequence is its only padded one, so from each shard's sequence and real token counts the
places of all the padding in the epoch order of `C` canonical streams follow by arithmetic."""

from __future__ import annotations

import bisect
import itertools

import numpy

from dist_resume.packing.packed import PackedStream
from dist_resume.streams.canonical import stream_lengths


def padded_places(stream: PackedStream, epoch: int, canonical_streams: int) -> tuple[numpy.ndarray, numpy.ndarray]:
    """The epoch positions of the padded sequences of `stream` (mode "concat") in epoch
    `epoch` read by `canonical_streams` canonical streams (position `m`: item `m // C` of
    stream `m % C`), in increasing order, and the padding each holds. A shard whose real
    tokens do not make its sequence count (it changed between the two counts, or `tokens=`
    is wrong) is a `ValueError` naming it."""
    width = stream.reader.width
    lengths, tokens = stream.lengths(), stream.shard_tokens()
    starts = list(itertools.accumulate(stream_lengths(sum(lengths), canonical_streams), initial=0))
    places, paddings, offset = [], [], 0
    for shard in stream.shard_order(epoch):
        count = lengths[shard]
        if count != -(-tokens[shard] // width):
            raise ValueError(f"shard {stream.shards[shard]} holds {tokens[shard]} real tokens, which pack into "
                             f"{-(-tokens[shard] // width)} sequences of {width} tokens, but its sequence count is "
                             f"{count}: the shard changed between the two counts, or lengths= or tokens= is wrong")
        padding = count * width - tokens[shard]
        if padding:
            place = offset + stream.item_place(epoch, shard, count - 1)
            canonical = bisect.bisect_right(starts, place) - 1
            places.append((place - starts[canonical]) * canonical_streams + canonical)
            paddings.append(padding)
        offset += count
    order = numpy.argsort(places, kind="stable")
    return numpy.array(places, dtype=numpy.int64)[order], numpy.array(paddings, dtype=numpy.int64)[order]
