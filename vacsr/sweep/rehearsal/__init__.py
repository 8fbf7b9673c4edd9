"""A sweep rehearsed (`--rehearse`): its machinery for real, its training replaced by the cost
model's waits and a synthetic curve (clock.py), in its trials (trial.py) and final seeds
(finals.py).
"""
