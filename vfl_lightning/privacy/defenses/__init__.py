"""Defenses against the attacks of ``privacy.attacks`` (``defense=`` group): gradient noise,
gradient sparsification, distance correlation, label DP."""
