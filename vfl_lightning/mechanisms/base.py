"""The mechanism interface: how the parties' embeddings reach the server.

A mechanism has a party side (:meth:`Mechanism.encode`: what each party puts on the wire) and a
server side (:meth:`Mechanism.fuse`: the server's input built from what arrived). Gradients pass
straight through (:meth:`Mechanism.party_gradients`): party m receives dL/d(fused) mapped to its
own embedding, ∂h̃/∂h_m = I for sums. Plain torch; randomness only from the generator passed in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from vfl_lightning.wire.codecs import Codec, RingCodec

FUSIONS = ("sum", "mean", "concat", "max")

RELEASE_STREAMS = ("train", "val", "test", "sanity", "predict")
"""Release streams: training rounds, and one stream per evaluation stage (the sanity check and
``predict`` included). Each release's round number carries its stream in the top bits."""
STREAM_SHIFT = 56
EVALUATION_SHIFT = 24
"""An evaluation at training round r releases from index r << 24 on (see ``begin_evaluation``)."""


def release_round(stream: str, index: int) -> int:
    """The round number of the ``index``-th release of ``stream``: (stream id << 56) | index.

    Training is stream 0, so its round numbers are the training rounds themselves. Distinct
    (stream, index) pairs give distinct round numbers, hence distinct secure-aggregation mask
    streams (the pair key is a bijection of the round number, see ``PairwiseMasking``).
    """
    if stream not in RELEASE_STREAMS:
        raise ValueError(f"release stream must be one of {RELEASE_STREAMS}, got {stream!r}")
    if not 0 <= int(index) < 1 << STREAM_SHIFT:
        raise ValueError(f"release index must be in [0, 2^{STREAM_SHIFT}), got {index}")
    return (RELEASE_STREAMS.index(stream) << STREAM_SHIFT) | int(index)


def party_generator(
    generator: torch.Generator | Sequence[torch.Generator] | None, party: int
) -> torch.Generator | None:
    """Party ``party``'s generator: the m-th of a per-party sequence, or the shared one."""
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    return generator[party]


def check_fusion(fusion: str) -> str:
    if fusion not in FUSIONS:
        raise ValueError(f"fusion must be one of {FUSIONS}, got {fusion!r}")
    return fusion


def max_winners(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """For element-wise max fusion: per element, the index of the party whose value is the
    maximum (the lowest index among ties, as ``torch.argmax`` documents)."""
    return torch.stack([t.detach() for t in tensors]).argmax(0)


def fuse_tensors(tensors: Sequence[torch.Tensor], fusion: str) -> torch.Tensor:
    """Sum, mean, element-wise maximum or concatenation (last dimension) of the party tensors.

    The maximum is a gather at :func:`max_winners`, so autograd sends each element's gradient to
    the one party that won it (a subgradient of max; ties go to the lowest party index)."""
    if fusion == "concat":
        return torch.cat(list(tensors), dim=-1)
    if fusion == "max":
        stacked = torch.stack(list(tensors))
        return stacked.gather(0, max_winners(tensors).unsqueeze(0)).squeeze(0)
    total = torch.stack(list(tensors)).sum(0)
    return total / len(tensors) if fusion == "mean" else total


def join_own_embedding(
    fused: torch.Tensor, own: torch.Tensor, fusion: str, num_senders: int
) -> torch.Tensor:
    """The fusion of ``num_senders`` received embeddings extended by the server's own embedding
    (an active label holder's features), as if it were one more party: sum, mean, max or concat
    (under max the received fusion wins ties, as the lower party indices do)."""
    if fusion in ("concat", "max"):
        return fuse_tensors([fused, own], fusion)
    if fusion == "mean":
        return (fused * num_senders + own) / (num_senders + 1)
    return fused + own


def split_gradient(
    grad: torch.Tensor,
    fusion: str,
    widths: Sequence[int],
    winners: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """The gradient each party's embedding receives from dL/d(fused) under ``fusion``. Under max,
    party m receives the gradient where it won (``winners``, from :func:`max_winners`) and zero
    elsewhere: the subgradient that autograd gives through :func:`fuse_tensors`."""
    if fusion == "max":
        if winners is None:
            raise ValueError("max fusion splits the gradient by the winners of the last fusion")
        zero = torch.zeros((), dtype=grad.dtype, device=grad.device)
        return [torch.where(winners == m, grad, zero) for m in range(len(widths))]
    if fusion == "concat":
        return list(torch.split(grad, list(widths), dim=-1))
    if fusion == "mean":
        grad = grad / len(widths)
    return [grad] * len(widths)


def fused_width(widths: Sequence[int], fusion: str) -> int:
    """Width of the fused server input: the common width for sum/mean/max, the total for concat."""
    if fusion == "concat":
        return int(sum(widths))
    if len(set(widths)) != 1:
        raise ValueError(
            f"fusion '{fusion}' needs every party embedding to have the same width, got {list(widths)}"
        )
    return int(widths[0])


class Mechanism(ABC):
    """Party-side encoding, server-side fusion and straight-through gradients.

    ``num_parties`` is M (given by ``train()`` at instantiation). ``fusion`` says how the server
    combines the parties (sum, mean, concat; max under the plain mechanism). ``apply_at_eval``
    says whether validation and test also go through the mechanism (as a deployment would) or see
    the plain fusion of the clean embeddings. ``bits_per_element`` is the uplink width of one
    element of a message (``None``: the payload dtype's width). ``stats`` holds the last
    training step's diagnostics as tensors (logged by the algorithm, never synchronized here).
    ``noisy``: the release adds noise (PBM, LDP), so evaluation through it differs from the clean
    sum and the algorithm also logs the clean accuracy (``val/acc_clean``).

    Training releases use the training round as ``round``; evaluation releases
    (:meth:`evaluate`) count their own releases per stream in ``eval_releases`` and use
    :func:`release_round` of (stream, count), so no two releases of a run share masks. The counts
    are part of :meth:`state_dict` and continue across a resume; :meth:`begin_evaluation` also
    lifts a stream's count to at least (training round << 24), so an evaluation that ran after
    the last checkpoint (the test after fitting) is not repeated with the same masks by a resumed
    run that trained further.
    """

    bits_per_element: int | None = None
    noisy: bool = False
    uses_pair_masks = False
    """Whether messages carry secure-aggregation masks (then :meth:`set_pair_seeds` applies)."""
    noise_multiplier: float | None = None
    """The noise of one party's release: its per-element standard deviation over the clipping
    bound, at its smallest over the inputs (None: the release adds no noise). A party's policy
    compares it with its ``min_noise``."""
    accounting: str | None = None
    """The privacy analysis of this mechanism (``pbm``, ``ldp``; None: no accounting), which the
    accountant applies to :meth:`parameters_state` (it never imports a mechanism)."""
    clip_bound: float | None = None
    """C: every released embedding element is clipped to [−C, C] first (None: nothing clipped)."""

    def __init__(self, num_parties: int, fusion: str = "sum", apply_at_eval: bool = True) -> None:
        if int(num_parties) < 1:
            raise ValueError(f"num_parties must be >= 1, got {num_parties}")
        self.num_parties = int(num_parties)
        self.fusion = check_fusion(fusion)
        self.apply_at_eval = bool(apply_at_eval)
        self.stats: dict[str, torch.Tensor] = {}
        self.eval_releases = {stream: 0 for stream in RELEASE_STREAMS[1:]}

    def fused_width(self, widths: Sequence[int]) -> int:
        return fused_width(widths, self.fusion)

    @abstractmethod
    def encode(
        self,
        embeddings: Sequence[torch.Tensor],
        *,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
        round: int = 0,
    ) -> list[torch.Tensor]:
        """Party side: the message each party m sends for its (detached) embedding. ``generator``
        is one generator for every party, or one per party (party m draws from the m-th)."""

    def encode_party(
        self,
        party: int,
        embedding: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        round: int = 0,
    ) -> torch.Tensor:
        """Party ``party`` alone (a party process): its message, bit-identical to
        ``encode(embeddings, generator=[..., generator, ...], round=round)[party]``. Default: the
        plain embedding (mechanisms that add noise or masks override it)."""
        return embedding.detach()

    def neighbouring_extremes(self, coins: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
        """One party's inputs at the largest distance the privacy analysis allows, by coin: every
        element +C (coin 1) or −C (coin 0), of ``shape`` per coin (float32, on ``coins``' device).
        Its two values are the worst-case neighbours of a release (a message canary's input)."""
        if self.clip_bound is None:
            raise ValueError(f"{type(self).__name__} clips nothing: its inputs have no extremes")
        sign = coins.to(torch.float32) * 2.0 - 1.0
        extremes = sign.view(-1, *[1] * len(shape)) * float(self.clip_bound)
        return extremes.expand(len(coins), *shape).contiguous()

    def set_pair_seeds(self, pair_seeds: dict[tuple[int, int], int]) -> None:
        """Hold exactly ``pair_seeds`` (pair -> seed) for secure aggregation: a party its own
        pairs, the server none. Only for mechanisms with ``uses_pair_masks``."""
        raise ValueError(f"{type(self).__name__} does not use secure-aggregation pair seeds")

    @abstractmethod
    def fuse(self, messages: Sequence[torch.Tensor]) -> torch.Tensor:
        """Server side: the fused float input of the server model, from the received messages."""

    def uplink_codec(self) -> Codec:
        """The form a party's message crosses in: ring elements packed at ``bits_per_element``
        bits, else the tensor's own bytes."""
        return Codec() if self.bits_per_element is None else RingCodec(self.bits_per_element)

    def downlink_codec(self) -> Codec:
        """The form the server's gradient crosses in (the symmetric side: the server encodes,
        the party decodes in its own process): float32 gradients by default."""
        return Codec()

    def party_gradients(self, grad: torch.Tensor, widths: Sequence[int]) -> list[torch.Tensor]:
        """Straight-through: the gradient for each party's embedding from dL/d(fused)."""
        return split_gradient(grad, self.fusion, widths)

    def release(
        self,
        embeddings: Sequence[torch.Tensor],
        *,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
        round: int = 0,
    ) -> torch.Tensor:
        """Encode and fuse in one go (evaluation; no wire accounting)."""
        return self.fuse(self.encode(embeddings, generator=generator, round=round))

    def begin_evaluation(self, stream: str, training_round: int) -> int:
        """Start an evaluation of ``stream`` at ``training_round``: its releases continue from
        max(current count, training_round << 24), so they stay unique across a resume. Returns
        the evaluation's first release round, unique in the run (it seeds the evaluation's noise;
        without ``apply_at_eval`` the round is reserved all the same)."""
        self._check_stream(stream)
        floor = int(training_round) << EVALUATION_SHIFT
        self.eval_releases[stream] = max(self.eval_releases[stream], floor)
        first = release_round(stream, self.eval_releases[stream])
        if not self.apply_at_eval:
            self.eval_releases[stream] += 1
        return first

    def _check_stream(self, stream: str) -> None:
        if stream not in self.eval_releases:
            raise ValueError(
                f"evaluation stream must be one of {tuple(self.eval_releases)}, got {stream!r}"
            )

    def next_release(self, stream: str) -> int | None:
        """The round of the next evaluation release of ``stream`` (counted), or ``None`` when
        evaluation sees the plain embeddings (``apply_at_eval=false``)."""
        self._check_stream(stream)
        if not self.apply_at_eval:
            return None
        round = release_round(stream, self.eval_releases[stream])
        self.eval_releases[stream] += 1
        return round

    def fuse_evaluation(self, messages: Sequence[torch.Tensor], round: int | None) -> torch.Tensor:
        """The server input from evaluation messages of release ``round`` (``None``: plain)."""
        return fuse_tensors(messages, self.fusion) if round is None else self.fuse(messages)

    def evaluate(
        self,
        embeddings: Sequence[torch.Tensor],
        *,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
        stream: str = "val",
    ) -> torch.Tensor:
        """The server input at evaluation time (``stream``: val, test, sanity or predict),
        honouring ``apply_at_eval``; each release takes the next round of its own stream."""
        round = self.next_release(stream)
        if round is None:
            return fuse_tensors(embeddings, self.fusion)
        return self.release(embeddings, generator=generator, round=round)

    def state_dict(self) -> dict:
        return {"eval_releases": dict(self.eval_releases)}

    def load_state_dict(self, state: dict) -> None:
        self.eval_releases |= state.get("eval_releases", {})
