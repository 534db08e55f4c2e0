"""The ``tessera`` command line."""
