"""What a sweep will cost before it runs: counts, measured step costs, the estimate."""
