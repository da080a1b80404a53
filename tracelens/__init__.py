"""tracelens: where the GPU time of a training job went."""

__version__ = "0.1.0"
