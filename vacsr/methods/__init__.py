"""Few-shot CLIP methods as plug-ins (vacsr/methods/method.py): VACSR, the sigmoid baseline and
the standard methods it is compared with, one module each, listed in registry.py."""
