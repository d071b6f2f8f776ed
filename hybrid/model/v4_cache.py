"""What DeepSeek-V4's attention caches hold for one request (spec_v4.py has the layers), counted
by `rules explain`.

V4 caches one tensor per cached row where MLA caches a latent: its one key/value head (K = V,
`head_dim` wide). Per layer, for a request of n tokens:
- every layer: its sliding window's raw rows, the last `sliding_window - 1` (the newest token's
  comes with its step);
- HCA (compress ratio 128): one compressed row per 128 tokens, and the compressor's open
  window: n mod 128 rows of key and of gate (`head_dim` each);
- CSA (ratio 4): one compressed row per 4 tokens and one of the indexer's keys
  (`index_head_dim`) beside it; the open windows, n mod 4 rows of key and of gate in both
  series (2 x head_dim for the compressor, 2 x index_head_dim for the indexer's); and once a
  window closed, its 4 rows' first series (key and gate, head_dim and index_head_dim wide)
  that the next window overlaps.

These are the states transformers' DeepseekV4 cache layers keep (DeepseekV4HCACache,
DeepseekV4CSACache; its plain window layers store the window twice, as keys and as values:
counted once here). So the cost of a long context is the compressed rows: per token
(head_dim + index_head_dim) / 4 for each CSA layer and head_dim / 128 for each HCA layer, a
fraction of a full MLA latent per layer.

The prefix cache keeps finished prompts' and requests' caches (engine/runner/cache_store.py):
at most `store_entries` of them, holding at most the cache's tokens in all; `store_bytes` bounds
what they hold (each entry's windows are full at most, the compressed rows count the tokens).

No torch here.
"""

from __future__ import annotations

from hybrid.model.spec_v4 import V4Spec

CSA, HCA = 4, 128


def layer_rows(spec: V4Spec, layer: int, tokens: int) -> int:
    """Floats layer `layer`'s caches hold for one request of `tokens` tokens."""
    ratio, hd, ihd = spec.compress_ratios[layer], spec.head_dim, spec.index_head_dim
    floats = min(tokens, spec.sliding_window - 1) * hd  # the window
    if ratio == HCA:
        floats += tokens // HCA * hd + 2 * (tokens % HCA) * hd
    elif ratio == CSA:
        floats += tokens // CSA * (hd + ihd)  # compressed keys, the indexer's beside them
        floats += 2 * (tokens % CSA) * (2 * hd + 2 * ihd)  # open windows: key and gate
        if tokens >= CSA:  # the last closed window's first series (its 4 rows), key and gate
            floats += 2 * CSA * (hd + ihd)
    return floats


def request_bytes(spec: V4Spec, tokens: int, dtype_bytes: int,
                  layers: list[int] | None = None) -> int:
    """Bytes the caches of `layers` (every layer when None) hold for one request of
    `tokens` tokens, each float `dtype_bytes` wide."""
    chosen = range(spec.num_layers) if layers is None else layers
    return dtype_bytes * sum(layer_rows(spec, i, tokens) for i in chosen)


def compressed_bytes_per_token(spec: V4Spec, dtype_bytes: int,
                               layers: list[int] | None = None) -> float:
    """What each further token of context adds to the caches of `layers` (every layer when
    None): their compressed rows (the windows and open windows stay bounded)."""
    per = {0: 0.0, CSA: (spec.head_dim + spec.index_head_dim) / CSA, HCA: spec.head_dim / HCA}
    chosen = range(spec.num_layers) if layers is None else layers
    return dtype_bytes * sum(per[spec.compress_ratios[i]] for i in chosen)


def store_entries(max_batch_size: int) -> int:
    """The most caches the prefix cache's store keeps: as many as are admitted at once, twice
    (a prompt's and its request's), and a few at least."""
    return max(8, 2 * max_batch_size)


def store_rows(spec: V4Spec, layer: int, tokens: int, entries: int) -> int:
    """At most the floats layer `layer`'s caches hold over `entries` requests' caches of
    `tokens` tokens in all (however the tokens fall between them): layer_rows' terms, each
    window and open window at its fullest in every entry, no more than the tokens give."""
    ratio, hd, ihd = spec.compress_ratios[layer], spec.head_dim, spec.index_head_dim
    floats = min(tokens, entries * (spec.sliding_window - 1)) * hd
    if ratio == HCA:
        floats += tokens // HCA * hd + 2 * min(tokens, entries * (HCA - 1)) * hd
    elif ratio == CSA:
        floats += tokens // CSA * (hd + ihd)
        floats += 2 * min(tokens, entries * (CSA - 1)) * (2 * hd + 2 * ihd)
        floats += 2 * CSA * min(entries, tokens // CSA) * (hd + ihd)
    return floats


def store_bytes(spec: V4Spec, tokens: int, entries: int, dtype_bytes: int,
                layers: list[int] | None = None) -> int:
    """At most the bytes the prefix cache's store holds in the caches of `layers` (every layer
    when None): `entries` caches of `tokens` tokens in all."""
    chosen = range(spec.num_layers) if layers is None else layers
    return dtype_bytes * sum(store_rows(spec, i, tokens, entries) for i in chosen)
