"""vacsr: Variational Adapter for Cross-modal Similarity Representation (arXiv 2605.30968)."""

__version__ = "0.1.0"
