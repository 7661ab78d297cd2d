"""HearthNet: a peer-to-peer mesh node for home servers."""

__version__ = "0.3.0"
