"""Token-level records of one request in one pass, and their storage encodings (**contract**,
docs/storage.md).

- In memory an output's tokens are numpy arrays, as the engines hand them over (`Completion`): the ids,
  the sampled tokens' logprobs, and the top-k as two (positions, k) arrays in rank order, with each row's
  length where some row is shorter than k. Lists are accepted and converted once.
- `digest`: SHA-256 over b"ids" + ids (int32 LE) + b"lp" + logprobs (float64 LE, the sampled token's
  logprob at each position). Equal digests mean equal ids and equal logprob bits, so comparisons decide on
  digests and decode only outputs whose digests differ. vLLM's logprobs are float32; float64 holds every
  float32 exactly, so float64 keeps every bit of any engine's values.
- `payload`: everything else the store keeps of an output (ids, logprobs, top-k, texts) in one
  content-addressed blob, stored once however many passes and runs produced it. It is lossless: ids
  exact, logprob bits exact (float32 only when every value is exactly a float32). A pass is encoded at
  once (`encode_pass`): its ids and floats are converted in a few array operations for the whole pass, and
  each output's digest is computed on the same buffers.
- Prompt ids (and the outputs of schema revisions before 0009): little-endian int32 / float64 arrays.

One module per job: packing.py (byte codecs, the digest), topk.py (arrays and top-k ranking),
completion.py (`Completion`, `Positions`), payload.py (the payload codec and its view), stored.py
(`StoredCompletion`). numpy is imported by the functions that use it (topk.py).
"""

from __future__ import annotations

from .completion import Completion, Positions
from .packing import output_digest, pack_floats, pack_ids, unpack_floats, unpack_ids
from .payload import (
    PAYLOAD_VERSION,
    EncodedPass,
    PayloadView,
    decode_payload,
    encode_pass,
    encode_payload,
    payload_fields,
    payload_view,
    signature,
)
from .stored import StoredCompletion
from .topk import as_floats, as_ids, rank_top, rank_top_rows, top_arrays

__all__ = ["PAYLOAD_VERSION", "Completion", "EncodedPass", "PayloadView", "Positions", "StoredCompletion", "as_floats",
           "as_ids", "decode_payload", "encode_pass", "encode_payload", "output_digest", "pack_floats", "pack_ids",
           "payload_fields", "payload_view", "rank_top", "rank_top_rows", "signature", "top_arrays", "unpack_floats",
           "unpack_ids"]
