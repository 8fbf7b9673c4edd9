"""What a sweep is, as data: its kind, the paper's ranges and numbers, its search spaces."""
