"""Data-parallel training (``trainer=ddp``): every rank embeds its share of each global batch, the
server and the wire are replicated; see :mod:`.rows` (the math) and :mod:`.strategy` (Lightning)."""

from vfl_lightning.parallel.rows import RowShares, share_bounds
from vfl_lightning.parallel.strategy import FederationDDPStrategy, rank_rows

__all__ = ["FederationDDPStrategy", "RowShares", "rank_rows", "share_bounds"]
