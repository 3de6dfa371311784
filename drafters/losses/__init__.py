"""Drafter losses: pure functions returning `(loss, metrics)`, metrics detached float tensors.

Label alignment and the loss-mask rule are in `labels.py`; every loss uses them.
"""

from drafters.losses.csgd import choose_glance, csgd_lambda, csgd_step, pass2_inputs
from drafters.losses.falcon import add_feature_noise, falcon_loss, falcon_valid
from drafters.losses.heads import head_labels, heads_loss
from drafters.losses.labels import shift_left, span_valid

__all__ = [
    "add_feature_noise",
    "choose_glance",
    "csgd_lambda",
    "csgd_step",
    "falcon_loss",
    "falcon_valid",
    "head_labels",
    "heads_loss",
    "pass2_inputs",
    "shift_left",
    "span_valid",
]
