"""Privacy: pure analysis (``analysis/``), the accountant (``accountant``), its training callback
(``callback``). Import the submodules; this package imports nothing so ``analysis`` stays light."""
