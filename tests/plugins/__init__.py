"""A protocol, a mechanism, an attack, a dataset and a partition written outside the library, each
one Python module here and one YAML file under ``conf/`` (see docs/extending.md)."""
