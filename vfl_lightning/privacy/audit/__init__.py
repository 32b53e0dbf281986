"""Privacy audits: empirical lower bounds on ε from what a role observed, beside the accountant's ε
(``audit=canary``, ``audit=canary_sample``)."""

from vfl_lightning.privacy.audit.canary import CanaryAudit, CanaryAuditor, accountant_epsilon

__all__ = ["CanaryAudit", "CanaryAuditor", "accountant_epsilon"]
