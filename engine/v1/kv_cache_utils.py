"""A v1 KV cache block and the chained block hash (vLLM v1 `vllm/v1/core/kv_cache_utils.py`:
KVCacheBlock, hash_block_tokens, init_none_hash; `vllm/utils/hashing.py`: sha256, xxhash and their
CBOR forms, sha256_cbor and xxhash_cbor, which need the cbor2 package).

A full block's hash covers (its parent block's hash, or NONE_HASH for the first block, its token
ids, its extra keys), so equal hashes mean equal prefixes. NONE_HASH is seeded as vLLM 0.33's
init_none_hash (resolve_none_hash_seed) seeds it: hash_fn(PYTHONHASHSEED) when that is set, otherwise
hash_fn("vllm-none-hash"). For xxhash and xxhash_cbor vLLM draws random bytes instead (a seed kept
secret where the hash is not collision resistant); we keep "vllm-none-hash" there too, so runs and
traces are reproducible, and kv_manager="vllm" is seeded alike (engine/vllm_core/scheduler.py).
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

BlockHash = bytes
HashFunction = Callable[[Any], bytes]
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"  # vLLM 0.33 kv_cache_utils.DEFAULT_NONE_HASH_SEED


def sha256(value: Any) -> bytes:
    """vLLM's default prefix-caching hash: SHA-256 over the pickled value (hashing.sha256)."""
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def xxhash_128(value: Any) -> bytes:
    """vLLM's `xxhash` option: 128-bit xxh3 over the pickled value (hashing.xxhash)."""
    return xxhash.xxh3_128_digest(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _cbor(value: Any) -> bytes:
    """The value as canonical CBOR (vLLM's *_cbor hashes: the same bytes in any language)."""
    try:
        import cbor2
    except ImportError:
        raise ValueError("the *_cbor prefix caching hashes need the cbor2 package: pip install cbor2") from None
    return cbor2.dumps(value, canonical=True)


def sha256_cbor(value: Any) -> bytes:
    """vLLM's `sha256_cbor` option: SHA-256 over the value as canonical CBOR (hashing.sha256_cbor)."""
    return hashlib.sha256(_cbor(value)).digest()


def xxhash_128_cbor(value: Any) -> bytes:
    """vLLM's `xxhash_cbor` option: 128-bit xxh3 over the value as canonical CBOR (hashing.xxhash_cbor)."""
    return xxhash.xxh3_128_digest(_cbor(value))


HASH_FUNCTIONS: dict[str, HashFunction] = {"sha256": sha256, "xxhash": xxhash_128, "sha256_cbor": sha256_cbor,
                                           "xxhash_cbor": xxhash_128_cbor}


def get_hash_fn_by_name(name: str) -> HashFunction:
    """vLLM's get_hash_fn_by_name for `prefix_caching_hash_algo`."""
    try:
        return HASH_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"prefix_caching_hash_algo must be one of {', '.join(HASH_FUNCTIONS)}, "
                         f"got {name!r}") from None


def resolve_none_hash_seed() -> str:
    """The seed NONE_HASH is hashed from (vLLM 0.33 resolve_none_hash_seed): PYTHONHASHSEED when
    set, else "vllm-none-hash" (vLLM's random bytes for xxhash aside, as the module says)."""
    return os.environ.get("PYTHONHASHSEED", DEFAULT_NONE_HASH_SEED)


def none_hash(hash_fn: HashFunction) -> BlockHash:
    """The parent hash of a chain's first block (vLLM's NONE_HASH from init_none_hash)."""
    return hash_fn(resolve_none_hash_seed())


def hash_block_tokens(hash_fn: HashFunction, parent_block_hash: BlockHash | None,
                      token_ids: Sequence[int], extra_keys: tuple | None = None) -> BlockHash:
    """vLLM's hash_block_tokens: hash_fn((parent hash or NONE_HASH, token ids, extra keys))."""
    parent = parent_block_hash if parent_block_hash is not None else none_hash(hash_fn)
    return hash_fn((parent, tuple(token_ids), extra_keys))


def external_block_hash(block_hash: BlockHash) -> int:
    """The hash as events and traces carry it: its low 64 bits as an int (vLLM's
    maybe_convert_block_hash with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)."""
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """One physical block's metadata (vLLM v1 KVCacheBlock): its id, how many requests hold it,
    its hash once it is full and cached, and its links in the free queue while it is free."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None
    is_null: bool = False  # block 0: a placeholder, never allocated, freed or counted

    def reset_hash(self) -> None:
        """Forget the hash when the block is evicted from the prefix cache."""
        self.block_hash = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, hashed={self.block_hash is not None})"
