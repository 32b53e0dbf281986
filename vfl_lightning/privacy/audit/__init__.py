"""Privacy audits: empirical lower bounds on ε from what a role observed, beside the accountant's ε
(``audit=canary``, ``audit=canary_sample``, ``audit=canary_message``, ``audit=canary_label``)."""

from vfl_lightning.privacy.audit.canary import CanaryAudit, CanaryAuditor, accountant_epsilon
from vfl_lightning.privacy.audit.labels import LabelCanaryAudit
from vfl_lightning.privacy.audit.messages import MessageCanaryAudit, MessageCanaryAuditor

__all__ = [
    "CanaryAudit",
    "CanaryAuditor",
    "LabelCanaryAudit",
    "MessageCanaryAudit",
    "MessageCanaryAuditor",
    "accountant_epsilon",
]
