"""drafters: train, export and benchmark speculative-decoding drafters."""

__version__ = "0.1.0"
