"""Evaluation: retrieval and classification metrics, the chunked pairwise scorer."""
