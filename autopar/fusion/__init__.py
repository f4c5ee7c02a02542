"""Horizontal fusion of K models of one architecture (HFTA, MLSys'21), by an fx rewrite.

``fuse(models, example_inputs)`` -> one module over K stacked models; ``FusedAdamW`` /
``FusedSGD`` step all K with per-model hyper-parameters. Middle layer: imports autopar.core only.
"""

from autopar.fusion.fuse import FusedModule, fuse
from autopar.fusion.optim import FusedAdamW, FusedSGD

__all__ = ["FusedAdamW", "FusedModule", "FusedSGD", "fuse"]
