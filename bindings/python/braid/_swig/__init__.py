"""The modules SWIG generates from braid's headers (one per layer of the library)."""
