"""Benchmarks: ``python -m tessera.bench.<name>``; the last line printed is one JSON object."""
