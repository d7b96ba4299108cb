"""The prefix store: final keys and values of complete blocks, shared by every request of an engine.

On a block-causal model (LLaDA2.x, SDAR, tiny-bd) a complete block's keys and values depend only on
the tokens of that block and of the blocks before it (blocks laid from the prompt's first token,
RoPE positions counted from it). So a block is named by a chain of hashes, as vLLM names its
prefix blocks: ``digest(block i) = H(digest(block i-1), block length, tokens of block i)``; two
requests whose first n blocks hold the same tokens have the same n digests, and the second may take
the first's keys and values instead of computing them.

The store holds whole blocks within a byte budget and evicts the least recently used block that no
request holds (its ``refs``). A lookup touches the matched chain from its last block to its first,
so a chain's first blocks are the last to go (a child is evicted before its parent). Only the
engine's loop reads and writes it (decode/prefix_reuse.py); a server's /metrics reads ``stats()``
(plain ints) from another thread.

Full-sequence models (LLaDA, Dream) attend in both directions: a prompt's keys depend on everything
after it, so nothing there is final and the store does not apply (prefix_reuse.check_budget).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

import torch

ROOT = b"caidllm-prefix-root"  # the parent digest of a chain's first block


def chain_digests(tokens: list[int], block_length: int, blocks: int) -> list[bytes]:
    """The digests of the first `blocks` complete blocks of `tokens` (each names its block and every
    block before it)."""
    digests, parent = [], ROOT
    for b in range(blocks):
        chunk = array("q", tokens[b * block_length : (b + 1) * block_length]).tobytes()
        parent = hashlib.blake2b(parent + block_length.to_bytes(4, "little") + chunk, digest_size=16).digest()
        digests.append(parent)
    return digests


@dataclass
class StoredBlock:
    """One block's final keys and values, every layer: [n_layers, n_kv_heads, block_length, head_dim]."""

    keys: torch.Tensor
    values: torch.Tensor
    refs: int = 0  # requests in flight holding it: never evicted while > 0

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() * 2


@dataclass
class StoreStats:
    """What the store did (the server's /metrics, the bench report)."""

    lookups: int = 0  # requests admitted with the store on
    hits: int = 0  # of which took at least one block
    blocks_reused: int = 0  # blocks copied into requests
    positions_saved: int = 0  # prompt positions not prefilled thanks to the store
    positions_prefilled: int = 0  # prompt positions prefilled (of the requests looked up)
    blocks_stored: int = 0  # blocks written
    blocks_evicted: int = 0
    blocks_skipped: int = 0  # blocks not written: no room left that no request held


class PrefixStore:
    """Blocks by chain digest, least recently used first, within `budget_bytes`."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = int(budget_bytes)
        self.blocks: OrderedDict[bytes, StoredBlock] = OrderedDict()  # least recently used first
        self.bytes_held = 0
        self.counters = StoreStats()
        # the model arithmetic its blocks were computed with (prefix_reuse.numerics)
        self.numerics: tuple = ()

    def __len__(self) -> int:
        return len(self.blocks)

    def match(self, digests: list[bytes]) -> list[StoredBlock]:
        """The longest run of stored blocks from the chain's start; touched (first block most recent)."""
        found = []
        for digest in digests:
            block = self.blocks.get(digest)
            if block is None:
                break
            found.append(block)
        self.touch(digests[: len(found)])
        return found

    def touch(self, digests: list[bytes]) -> None:
        for digest in reversed(digests):
            if digest in self.blocks:
                self.blocks.move_to_end(digest)

    def pin(self, digests: list[bytes]) -> None:
        for digest in digests:
            self.blocks[digest].refs += 1

    def unpin(self, digests: list[bytes]) -> None:
        for digest in digests:
            block = self.blocks.get(digest)
            if block is not None and block.refs > 0:
                block.refs -= 1

    def put(self, digest: bytes, keys: torch.Tensor, values: torch.Tensor) -> bool:
        """Store one block (its own copy), evicting unheld blocks if needed; False when there is no
        room that no request holds (nothing is written then). A block already stored is touched."""
        if digest in self.blocks:
            self.blocks.move_to_end(digest)
            return True
        block = StoredBlock(keys, values)
        if not self._make_room(block.nbytes):
            self.counters.blocks_skipped += 1
            return False
        block.keys, block.values = keys.clone(), values.clone()  # never a view of a slot's row
        self.blocks[digest] = block
        self.bytes_held += block.nbytes
        self.counters.blocks_stored += 1
        return True

    def _make_room(self, nbytes: int) -> bool:
        if nbytes > self.budget_bytes:
            return False
        if self.bytes_held + nbytes <= self.budget_bytes:
            return True
        free = [d for d, b in self.blocks.items() if b.refs == 0]  # least recently used first
        freeable = sum(self.blocks[d].nbytes for d in free)
        if self.bytes_held - freeable + nbytes > self.budget_bytes:
            return False
        for digest in free:
            if self.bytes_held + nbytes <= self.budget_bytes:
                break
            self.bytes_held -= self.blocks.pop(digest).nbytes
            self.counters.blocks_evicted += 1
        return True

    def clear(self) -> None:
        """Drop every block (a request that holds one keeps nothing it needs: blocks are copied)."""
        self.blocks.clear()
        self.bytes_held = 0

    def stats(self) -> dict:
        """The counters and what is held now, as plain numbers."""
        return {
            **vars(self.counters),
            "blocks_held": len(self.blocks),
            "bytes_held": self.bytes_held,
            "budget_bytes": self.budget_bytes,
        }
