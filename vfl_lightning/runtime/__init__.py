"""The Ray transport (``runtime=ray``): the party interface implemented by Ray actors, which the
run's picklable party factory builds; never imports ``run/`` or ``train``."""
