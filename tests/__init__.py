"""psrl's test suite (a regular package: a top-level ``tests`` package installed by a dependency, cufile-python
with the kv extra, must not shadow it)."""
