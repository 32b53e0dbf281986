"""Secure aggregation by pairwise masking (Bonawitz et al. 2016, Protocol 0; PBM-VFL paper §2.3).

The server receives only masked integers mod R; their sum mod R is exactly the sum of the secrets.
"""

from __future__ import annotations

import math

import torch

from vfl_lightning.mechanisms.keys import seeded_pair_seeds
from vfl_lightning.seeding import GOLDEN_GAMMA, as_int64, splitmix64, splitmix64_int

RING_BITS_LIMIT = 62
"""Largest ring 2^k we use: two residues < 2^62 add without leaving int64."""


def ring_bits(num_parties: int, trials: int) -> int:
    """⌈log2(M·b + 1)⌉: bits of the ring Z_R, R = 2^bits, that holds every sum of M values in [0, b]."""
    if int(num_parties) < 1:
        raise ValueError(f"num_parties must be >= 1, got {num_parties}")
    if int(trials) < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    largest_sum = int(num_parties) * int(trials)
    bits = largest_sum.bit_length()  # = ⌈log2(largest_sum + 1)⌉, exactly, for any size
    if bits > RING_BITS_LIMIT:
        raise ValueError(
            f"num_parties * b = {largest_sum} needs a ring of 2^{bits}, which does not fit int64 "
            f"arithmetic (at most 2^{RING_BITS_LIMIT}); lower b or the number of parties"
        )
    return bits


class PairwiseMasking:
    """Bonawitz Protocol 0 for M parties over Z_R, R = 2^``modulus_bits``.

    Every pair (i < j) holds a seed that only i and j know, from X25519 key agreement
    (:mod:`~vfl_lightning.mechanisms.keys`): ``pair_seeds`` gives the seeds this side holds (a
    party actor: its own M − 1 pairs once the authenticated key agreement ran; the server: none,
    it only sums). ``seed`` instead derives every pair's seed from keys made from it: the local
    runtime's simulation of every party, whose masks anyone with the seed can recompute. With
    neither, no pair is held and no party can mask: masking fails closed, nothing is sent before
    the pair seeds exist. For round r the
    pair expands (seed, r) with a counter-based PRG (splitmix64 of seed, round and element index)
    into a fresh mask u_ij of the message's shape; party i adds u_ij and party j subtracts it, mod R.
    The masks cancel in the sum, so Σ_m y_m = Σ_m q_m (mod R), and each y_m alone is uniform on
    Z_R when M ≥ 2. With M = 1 there is no pair and the single message is sent unmasked.
    All masks of a round come from one vectorized computation over (pair, element).
    """

    def __init__(
        self,
        num_parties: int,
        modulus_bits: int,
        seed: int | None = None,
        *,
        pair_seeds: dict[tuple[int, int], int] | None = None,
    ) -> None:
        if int(num_parties) < 1:
            raise ValueError(f"num_parties must be >= 1, got {num_parties}")
        if not 1 <= int(modulus_bits) <= RING_BITS_LIMIT:
            raise ValueError(f"modulus_bits must be in [1, {RING_BITS_LIMIT}], got {modulus_bits}")
        self.num_parties = int(num_parties)
        self.modulus_bits = int(modulus_bits)
        self.modulus = 1 << self.modulus_bits
        if pair_seeds is None:
            pair_seeds = {} if seed is None else seeded_pair_seeds(self.num_parties, seed)
        for first, second in pair_seeds:
            if not 0 <= first < second < self.num_parties:
                raise ValueError(
                    f"pair ({first}, {second}) is not two party ids 0 <= i < j < {self.num_parties}"
                )
        self.pairs = sorted(pair_seeds)
        self.adding_party = torch.tensor([i for i, _ in self.pairs], dtype=torch.int64)
        self.subtracting_party = torch.tensor([j for _, j in self.pairs], dtype=torch.int64)
        self.pair_seeds = [int(pair_seeds[pair]) for pair in self.pairs]
        self._pair_seed_words = torch.tensor(
            [as_int64(seed) for seed in self.pair_seeds], dtype=torch.int64
        )
        per_word = 64 // self.modulus_bits
        self._field_shifts = torch.arange(per_word, dtype=torch.int64) * self.modulus_bits
        self._cached_constants: tuple | None = None
        self._blocks: list[tuple[int, torch.Tensor]] = []
        self._last_block_rounds = 0

    @property
    def num_pairs(self) -> int:
        return len(self.pair_seeds)

    def stream_keys(self, round: int) -> list[int]:
        """Each pair's PRG key for round ``round``: splitmix64(pair seed XOR splitmix64(round)).

        splitmix64 is a bijection of 64-bit words, so for one pair distinct rounds in [0, 2^64)
        give distinct keys: callers keep rounds distinct (``mechanisms.base.release_round`` puts
        training and each evaluation stage in disjoint ranges) and masks are never reused.
        """
        if not 0 <= int(round) < 1 << 64:
            raise ValueError(f"round must be in [0, 2^64), got {round}")
        round_key = splitmix64_int(int(round))
        return [as_int64(splitmix64_int(seed ^ round_key)) for seed in self.pair_seeds]

    PYTHON_KEYS_MAX_PAIRS = 32
    """Up to this many pairs, :meth:`key_words` derives the keys with Python integers (a few
    microseconds a pair) rather than a dozen whole-tensor operations."""

    def key_words(self, round: int, device: torch.device | None = None) -> torch.Tensor:
        """:meth:`stream_keys` for all pairs at once as an int64 tensor (the same bits)."""
        if not 0 <= int(round) < 1 << 64:
            raise ValueError(f"round must be in [0, 2^64), got {round}")
        if self.num_pairs <= self.PYTHON_KEYS_MAX_PAIRS:
            return torch.tensor(self.stream_keys(round), dtype=torch.int64, device=device)
        round_key = as_int64(splitmix64_int(int(round)))
        return splitmix64(self._pair_seed_words.to(device) ^ round_key)

    def _constants(self, words: int, device: torch.device | None) -> tuple[torch.Tensor, ...]:
        """(word offsets (c+1)·γ for c < ``words``, field shifts, adding and subtracting party
        of each pair) on ``device``, kept for the last (words, device) asked for."""
        key = (words, str(device))
        if self._cached_constants is None or self._cached_constants[0] != key:
            steps = torch.arange(1, words + 1, dtype=torch.int64, device=device) * as_int64(
                GOLDEN_GAMMA
            )
            constants = (
                steps,
                self._field_shifts.to(device),
                self.adding_party.to(device),
                self.subtracting_party.to(device),
            )
            self._cached_constants = (key, constants)
        return self._cached_constants[1]

    def pair_masks(
        self, round: int, numel: int, device: torch.device | None = None
    ) -> torch.Tensor:
        """The masks u_ij of round ``round``: int64 in [0, R), shape (num_pairs, numel).

        Word c of pair k's stream is splitmix64(key_k + (c+1)·γ); each 64-bit word is cut into
        ⌊64 / log2 R⌋ disjoint fields of log2 R bits, one mask element per field.
        """
        return self._pair_masks_of_rounds([round], numel, device)[0]

    def _pair_masks_of_rounds(
        self, rounds: list[int], numel: int, device: torch.device | None
    ) -> torch.Tensor:
        """:meth:`pair_masks` of several rounds at once: shape (len(rounds), num_pairs, numel)."""
        per_word = 64 // self.modulus_bits
        words = -(-numel // per_word)
        steps, shifts, _, _ = self._constants(words, device)
        keys = torch.stack([self.key_words(round, device) for round in rounds])
        values = splitmix64(keys[:, :, None] + steps)
        # field f is bits [f·k, (f+1)·k) of the word, k = log2 R, (f+1)·k <= 64: the arithmetic
        # shift's copies of the sign bit land at bit 64 − f·k >= k or above, which the mask drops
        fields = (values[..., None] >> shifts) & (self.modulus - 1)
        return fields.reshape(len(rounds), self.num_pairs, words * per_word)[..., :numel]

    BLOCK_ELEMENTS = 1 << 16
    """A block of rounds holds at most this many (round, pair or party, element) mask values."""
    BLOCK_ROUNDS = 32
    """At most this many rounds are expanded in one block."""
    KEPT_BLOCKS = 3
    """Blocks kept at once (the latest ones)."""

    def _net_masks(self, round: int, numel: int, device) -> torch.Tensor:
        """Every party's net mask of ``round``, shape (M, ≥ numel), int64 in [0, R): a read-only
        view of a block of consecutive rounds expanded at once.

        A party's mask of round r does not depend on when it is computed, and the first n
        elements of a stream are the same whatever its length, so masks can be expanded ahead:
        while requests run through consecutive rounds (training), each new block covers twice
        as many rounds as the last (up to :attr:`BLOCK_ROUNDS` and :attr:`BLOCK_ELEMENTS`),
        which spreads the fixed cost of the dozen tensor operations of an expansion over them; a
        request outside the blocks kept (an evaluation stream, a longer message) starts a new
        block of one round. The last few blocks are kept, so evaluation releases between two
        training rounds do not evict the training block. Nothing here is state: a resumed run
        expands the same values.
        """
        device = torch.device("cpu") if device is None else torch.device(device)
        for start, block in self._blocks:
            if (
                start <= round < start + block.shape[0]
                and block.shape[2] >= numel
                and block.device == device
            ):
                return block[round - start]
        continues = any(start + block.shape[0] == round for start, block in self._blocks)
        rounds = 1
        if continues and self._last_block_rounds:
            rounds = min(2 * self._last_block_rounds, self.BLOCK_ROUNDS)
        per_round = max(self.num_pairs, self.num_parties) * numel
        rounds = max(1, min(rounds, self.BLOCK_ELEMENTS // per_round))
        rounds = min(rounds, (1 << 64) - round)
        block = torch.zeros(rounds, self.num_parties, numel, dtype=torch.int64, device=device)
        if self.num_pairs:
            masks = self._pair_masks_of_rounds(list(range(round, round + rounds)), numel, device)
            words = -(-numel // (64 // self.modulus_bits))
            _, _, adding, subtracting = self._constants(words, device)
            block.index_add_(1, adding, masks)
            block.index_add_(1, subtracting, masks, alpha=-1)
        # int64 addition wraps mod 2^64 and R divides 2^64, so reducing at the end is exact.
        block.bitwise_and_(self.modulus - 1)
        self._last_block_rounds = rounds
        self._blocks = [*self._blocks[-(self.KEPT_BLOCKS - 1) :], (round, block)]
        return block[0]

    def party_masks(
        self, round: int, shape: torch.Size | tuple[int, ...], device=None
    ) -> torch.Tensor:
        """Each party's net mask Σ_{j>m} u_mj − Σ_{i<m} u_im mod R: shape (M, *shape), a new
        tensor (the expanded blocks stay unchanged whatever the caller does with it)."""
        numel = math.prod(shape)
        masks = self._net_masks(round, numel, device)[:, :numel]
        return masks.clone(memory_format=torch.contiguous_format).view(self.num_parties, *shape)

    def holds_party(self, party: int) -> bool:
        """Whether every pair of ``party`` is held here (so its net mask can be computed)."""
        held = sum(party in pair for pair in self.pairs)
        return held == self.num_parties - 1

    def mask_party(self, party: int, secret: torch.Tensor, round: int) -> torch.Tensor:
        """Party ``party``'s side: y = q + mask_party mod R, from the pairs it holds; equal to
        ``mask(...)[party]`` of a masking that holds every pair."""
        if not self.holds_party(party):
            raise PermissionError(
                f"party {party} holds no pair seeds of its own (held pairs: {self.pairs}): it "
                "sends no message before the authenticated key agreement gave them"
            )
        numel = secret.numel()
        mask = self._net_masks(round, numel, secret.device)[party, :numel]
        return (secret.to(torch.int64) + mask.view(secret.shape)) & (self.modulus - 1)

    def mask(self, secrets: list[torch.Tensor], round: int) -> list[torch.Tensor]:
        """Party side: y_m = q_m + mask_m mod R for every party's integer tensor q_m."""
        if len(secrets) != self.num_parties:
            raise ValueError(f"expected {self.num_parties} party tensors, got {len(secrets)}")
        return list(self.mask_stacked(torch.stack(list(secrets)), round).unbind(0))

    def mask_stacked(self, secrets: torch.Tensor, round: int) -> torch.Tensor:
        """:meth:`mask` of the parties' secrets stacked as one (M, ...) integer tensor."""
        if secrets.shape[0] != self.num_parties:
            raise ValueError(f"expected {self.num_parties} party tensors, got {secrets.shape[0]}")
        if self.num_pairs != self.num_parties * (self.num_parties - 1) // 2:
            raise ValueError("this side does not hold every pair seed: each party masks its own")
        numel = secrets[0].numel()
        masks = self._net_masks(round, numel, secrets.device)[:, :numel].view(secrets.shape)
        return (secrets.to(torch.int64) + masks).bitwise_and_(self.modulus - 1)

    def secure_sum(self, masked: list[torch.Tensor]) -> torch.Tensor:
        """Server side: Σ_m y_m mod R, which equals Σ_m q_m when that sum is below R."""
        return torch.stack(list(masked)).sum(0) & (self.modulus - 1)
